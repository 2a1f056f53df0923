"""Chapter 04's live checks (not recorded experiments): what a linear layer and the fused kernels
really do on this machine, against the byte counts and the references of the library.

- `linear_touches` and `touches_table`: a real `nn.Linear`'s forward and backward under
  `counters.StorageTouches` (every op that reads W, or reads or writes dW) and its three matmuls
  under `counters.ByteCounter`, asserted equal to `bytes.linear_traffic`;
- `kernel_table`: the fused Triton kernels (the fma chain, softmax, RMSNorm) against their float64
  references on irregular shapes, in fp32 and fp16, within the kernels' tolerances.
Every function asserts what it shows: a count or a kernel that disagrees stops the page.
Used in: §sec-bytes.
"""

from __future__ import annotations

import torch

from mlsys import checks
from mlsys.accounting import bytes as bytes_moved
from mlsys.book import Table
from mlsys.counters import ByteCounter, StorageTouches


def ops_per_element(flop_per_s: float, bytes_per_s: float, moved_bytes: float) -> float:
    """Operations per element a device does in the time it moves one element's `moved_bytes`:
    below that many, an elementwise op is memory-bound (the ridge times the bytes per element)."""
    checks.positive(moved_bytes, "moved_bytes")
    return checks.positive(flop_per_s, "flop_per_s") * moved_bytes / checks.positive(
        bytes_per_s, "bytes_per_s")


def linear_touches(tokens: int, d_in: int, d_out: int, *, seed: int) -> StorageTouches:
    """The ops of a `d_in` -> `d_out` linear layer's second forward and backward on `tokens` rows
    (the second accumulates into the dW the first created) that touch W or dW, after
    `torch.manual_seed(seed)`. Asserts W read twice and dW read and written once, as
    `bytes.linear_traffic` counts, and the bytes of the three matmuls (Y = X W^T, dX, dW) under
    `ByteCounter` equal to its total."""
    torch.manual_seed(seed)
    layer = torch.nn.Linear(d_in, d_out, bias=False)
    x = torch.randn(tokens, d_in, requires_grad=True)
    layer(x).sum().backward()  # the first step creates W.grad
    with StorageTouches(W=layer.weight, dW=layer.weight.grad) as touches:
        layer(x).sum().backward()  # the second step accumulates into dW
    lin = bytes_moved.linear_traffic(tokens, d_in, d_out, "fp32")
    assert touches.count("W", kind="read") == lin.weight_reads == 2
    assert touches.count("dW", kind="write") == 1 and touches.count("dW", kind="read") == 1
    x_l, w_l = (torch.randn(*s, requires_grad=True) for s in ((tokens, d_in), (d_out, d_in)))
    dy = torch.randn(tokens, d_out)
    with ByteCounter() as counted:  # the three matmuls: Y = X W^T, then dX and dW
        torch.autograd.grad(x_l @ w_l.t(), (x_l, w_l), dy)
    assert (counted.read_bytes, counted.write_bytes) == (lin.total.read_bytes,
                                                         lin.total.write_bytes)
    return touches


def touches_table(touches: StorageTouches) -> Table:
    """One row per aten op that touched a named tensor: the names it read and wrote."""
    return Table(["aten op (forward + backward)", "reads", "writes"],
                 [[t.op, ", ".join(t.reads) or "-", ", ".join(t.writes) or "-"]
                  for t in touches.touches])


def kernel_table(generator: torch.Generator, device: str) -> Table:
    """`repeat_unary` (fma, k = 5) on 1,003 elements, softmax and RMSNorm on (37, 61) rows, in fp32
    and fp16 on `device`, against their references in float64 on inputs drawn from `generator`:
    the largest |error|, asserted within the kernels' tolerances. No rows without Triton."""
    from mlsys.kernels import _triton, elementwise, rmsnorm, softmax  # Triton (may be absent)

    rows = []
    for dt in (torch.float32, torch.float16) if _triton.HAS_TRITON else ():
        xs, xr, wr = (torch.randn(*shape, generator=generator).to(device, dt)
                      for shape in ((1003,), (37, 61), (61,)))
        for name, fn, ref, args in [("repeat_unary fma, k=5", elementwise.repeat_unary,
                                     elementwise.repeat_unary_ref, (xs, 5)),
                                    ("softmax (37, 61)", softmax.softmax, softmax.softmax_ref,
                                     (xr,)),
                                    ("rmsnorm (37, 61)", rmsnorm.rmsnorm, rmsnorm.rmsnorm_ref,
                                     (xr, wr))]:
            got = fn(*args).double()
            expected = ref(*(a.double() if isinstance(a, torch.Tensor) else a for a in args))
            torch.testing.assert_close(got, expected, **_triton.TOLERANCES[dt])
            rows.append([name, str(dt).removeprefix("torch."),
                         f"{(got - expected).abs().max():.2g}"])
    return Table(["kernel", "dtype", "max |error| vs float64"], rows)
