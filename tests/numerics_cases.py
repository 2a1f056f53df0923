"""What the tests of mlsys.numerics share (tests/numerics/test_precision.py, test_summation.py): a
dispatch mode that records where each op creates its tensors."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class CreatedDevices(TorchDispatchMode):
    """Records (op, device) of every tensor each aten op creates inside the `with` block."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self.seen += [(str(func), t.device.type) for t in tensors]
        return out
