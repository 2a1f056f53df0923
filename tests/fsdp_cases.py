"""What the tests of FSDP on models it was not written for share (tests/distributed/test_fsdp.py,
test_fsdp_units.py, test_fsdp_precision.py, test_torch_strategies.py): a stack of Linear layers in
`.layers` (also run last layer first, and skipping a layer every second step) and a language model
whose embedding is its head (tied weights); wrap policies (classes, a predicate); fp32 and bf16/fp16
from a chapter-07 precision policy; the rank function that trains each case with the hand-written
FSDP or PyTorch's FSDP2 (over a process group, a 1-D and a 2-D DeviceMesh), and one process that
computes the same way.

Imported by the test files and by their ranks (the tests directory is on the ranks' path).
"""

import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from mlsys.distributed import comms, fsdp
from mlsys.distributed.torch_strategies import apply_fully_shard
from mlsys.policies import policy

D, VOCAB, SEQ, BATCH, STEPS, LR, WD = 16, 32, 6, 8, 3, 0.2, 0.1
"""Width, vocabulary, tokens per sequence, global batch, SGD steps, learning rate and weight
decay. Gradients are zeroed, not freed, so weight decay moves even a layer that a forward skipped
(SkippingStack): a copy of it gathered before the step would be stale after it."""


class LinearStack(nn.Module):
    """x (batch, D) -> 4 x (Linear(D, D), tanh) in `.layers` -> Linear(D, 4) readout."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(D, D) for _ in range(4))
        self.readout = nn.Linear(D, 4)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.readout(x)


class MLP(nn.Module):
    """x + fc2(gelu(fc1(x))), (batch, seq, D) -> (batch, seq, D)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


class TiedLM(nn.Module):
    """tokens (batch, seq) -> embedding -> 2 MLPs in `.layers` -> LayerNorm -> head (batch, seq,
    VOCAB); the head's weight *is* the embedding's (one parameter, two uses)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(MLP() for _ in range(2))
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


class SkippingStack(LinearStack):
    """A LinearStack that skips layers.1 on every second call: a forward that changes."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        for i, layer in enumerate(self.layers):
            if i != 1 or self.calls % 2:
                x = torch.tanh(layer(x))
        return self.readout(x)


class BackwardsStack(LinearStack):
    """A LinearStack whose forward runs `.layers` last to first: not their registration order."""

    def forward(self, x):
        for layer in reversed(self.layers):
            x = torch.tanh(layer(x))
        return self.readout(x)


MODELS = {"stack": LinearStack, "backwards": BackwardsStack, "skipping": SkippingStack,
          "tied": TiedLM}


WRAPS = {
    "Linear": (nn.Linear,),
    "{Linear}": {nn.Linear},
    "MLP": (MLP,),
    "predicate": lambda name, module: name.startswith("layers.") and name.count(".") == 1,
}


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


PRECISIONS = {"fp32": None, "bf16": "bf16_mixed_adamw",
              "fp16": policy("bf16_mixed_adamw", low="fp16")}
"""The policy given to FSDP, by the dtype it computes in: none (the parameters' own, fp32); bf16
weights and gradients over fp32 master shards; the same in fp16 (no loss scaling)."""


CASES = {  # name: (model, wrap, implementation, precision)
    "stack, Linear, fp32": ("stack", "Linear", "ours", "fp32"),
    "stack, predicate, bf16": ("stack", "predicate", "ours", "bf16"),
    "backwards stack, Linear, fp32": ("backwards", "Linear", "ours", "fp32"),
    "skipping stack, Linear, fp32": ("skipping", "Linear", "ours", "fp32"),
    "tied, MLP, fp32": ("tied", "MLP", "ours", "fp32"),
    "tied, {Linear}, fp16": ("tied", "{Linear}", "ours", "fp16"),
    "FSDP2 stack, Linear, fp32": ("stack", "Linear", "torch", "fp32"),
    "FSDP2 stack, predicate, fp32, 2-D mesh": ("stack", "predicate", "torch 2-D", "fp32"),
    "FSDP2 tied, {Linear}, bf16, mesh": ("tied", "{Linear}", "torch mesh", "bf16"),
}


UNITS = {  # (model, wrap) -> the units besides the root, and what the root holds
    ("stack", "Linear"): ([f"layers.{i}" for i in range(4)] + ["readout"], []),
    ("stack", "predicate"): ([f"layers.{i}" for i in range(4)], ["readout.weight",
                                                                  "readout.bias"]),
    ("tied", "MLP"): (["layers.0", "layers.1"], ["embed.weight", "norm.weight", "norm.bias"]),
    # the head is a Linear but shares its weight with the root's embedding: it stays in the root
    ("tied", "{Linear}"): ([f"layers.{i}.fc{j}" for i in range(2) for j in (1, 2)],
                           ["embed.weight", "norm.weight", "norm.bias"]),
}


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    return MODELS[name]()


def batch(name: str, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global (inputs, targets) of `step`: (BATCH, D) and (BATCH, 4) floats for the stacks,
    (BATCH, SEQ) token ids and their next tokens for the language model."""
    g = torch.Generator().manual_seed(100 + step)
    if name != "tied":
        return torch.randn(BATCH, D, generator=g), torch.randn(BATCH, 4, generator=g)
    tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """In fp32 whatever the compute dtype (outputs come out in it)."""
    if target.is_floating_point():
        return F.mse_loss(out.float(), target)
    return F.cross_entropy(out.flatten(0, 1).float(), target.flatten())


def train(rank, case: str) -> dict:
    """STEPS SGD steps on this rank's half of each batch: the shards, the collectives of each step
    (ours), the first step's averaged gradients and the final weights, unsharded."""
    model_name, wrap, impl, precision = CASES[case]
    model = build(model_name)
    if impl == "ours":
        fsdp.apply_fsdp(model, rank.group, wrap=WRAPS[wrap], policy=PRECISIONS[precision])

        def full(grads=False):
            return model.fsdp.unsharded(grads=grads)
    else:
        where = rank.group
        if impl == "torch mesh":
            where = DeviceMesh.from_group(rank.group, "cpu")
        elif impl == "torch 2-D":  # HSDP: two replicas of one shard
            where = init_device_mesh("cpu", (2, 1), mesh_dim_names=("replicate", "shard"))
        apply_fully_shard(model, where, wrap=WRAPS[wrap], policy=PRECISIONS[precision])

        def full(grads=False):
            return {n: (p.grad if grads else p).full_tensor().detach().clone()  # not a view
                    for n, p in model.named_parameters()}  # (2-D: of the local shard)
    out = {"shards": [(n, p.dtype) for n, p in model.named_parameters()], "calls": [],
           "held": []}
    opt = torch.optim.SGD(model.parameters(), lr=LR, weight_decay=WD)
    for step in range(STEPS):
        x, y = (t.chunk(rank.world_size)[rank.rank] for t in batch(model_name, step))
        with comms.count_bytes() as count:
            loss = loss_of(model(x), y)
            if impl == "ours":  # units still gathered between forward and backward
                out["held"].append([u.name for u in model.fsdp.units
                                    if u.full.untyped_storage().size() > 0])
            loss.backward()
        out["calls"].append(dict(count.calls))
        if step == 0:
            out["grads"] = full(grads=True)
        opt.step()
        opt.zero_grad(set_to_none=False)
    out["params"] = full()
    out["order"] = [u.name for u in model.fsdp.order] if impl == "ours" else None
    return out


def extras(rank) -> dict:
    """What needs a group besides training: ranks that disagree on the units, pure bf16."""
    out = {}
    for impl, apply in (("ours", fsdp.apply_fsdp), ("torch", apply_fully_shard)):
        model = build("stack")
        wrap = WRAPS["Linear"] if rank.rank == 0 else WRAPS["predicate"]  # a bug: not the same
        try:
            apply(model, rank.group, wrap=wrap)
            out[impl] = "no error"
        except ValueError as error:
            out[impl] = str(error)
        out[f"{impl} intact"] = sorted(n for n, _ in model.named_parameters())
    pure = fsdp.apply_fsdp(build("stack"), rank.group, wrap=(nn.Linear,),
                           policy="bf16_pure_adamw")
    x, y = (t.chunk(2)[rank.rank] for t in batch("stack", 0))
    out["pure output"] = pure(x).dtype
    loss_of(pure(x), y).backward()
    out["pure shards"] = {(p.dtype, p.grad.dtype) for p in pure.parameters()}
    return out


def all_cases(rank, cases=tuple(CASES)) -> dict:
    """Each of `cases` (all by default) trained, and the extras."""
    return {case: train(rank, case) for case in cases} | {"extras": extras(rank)}


@functools.cache
def reference(model_name: str, precision: str) -> dict:
    """One process on the whole batch, computing as FSDP does: fp32 master weights; a copy in
    the compute dtype runs the forward and backward (floating inputs cast to it); its gradients,
    in that dtype, go to fp32 for the SGD step. The first step's gradients, the weights at the
    start and after STEPS steps."""
    master = build(model_name)
    start = {n: p.detach().clone() for n, p in master.named_parameters()}
    dtype = DTYPES[precision]
    low = copy.deepcopy(master).to(dtype)
    if model_name == "tied":
        assert low.head.weight is low.embed.weight
    opt = torch.optim.SGD(master.parameters(), lr=LR, weight_decay=WD)
    out = {"start": start}
    for step in range(STEPS):
        with torch.no_grad():
            for w, m in zip(low.parameters(), master.parameters(), strict=True):
                w.copy_(m)
        x, y = batch(model_name, step)
        loss_of(low(x.to(dtype) if x.is_floating_point() else x), y).backward()
        for w, m in zip(low.parameters(), master.parameters(), strict=True):
            if w.grad is not None:  # else: layers.1 skipped, its gradient stays zero
                m.grad, w.grad = w.grad.float(), None
        if step == 0:
            out["grads"] = {n: p.grad.clone() for n, p in master.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=False)
    out["params"] = {n: p.detach().clone() for n, p in master.named_parameters()}
    return out


def assert_close(got: dict, want: dict, scale: dict, precision: str, what: str) -> None:
    """fp32: equal up to the order of the sums (ranks add half-batch gradients; SGD is linear in
    them, so nothing amplifies it): rtol 1e-5, atol 1e-6. bf16/fp16: within 4 eps of the compute
    dtype (bf16 2^-7, fp16 2^-10) times the tensor's `scale` (its largest gradient, or how far
    SGD moved it): FSDP rounds each rank's gradient and their sum, the reference the whole-batch
    gradient, each to 0.5 eps; measured here at most 1.2 eps (bf16) and 0.9 eps (fp16). Any bug
    (a gradient not averaged, a tied use lost, a step missed) is off by about the scale itself."""
    assert set(got) == set(want), (what, sorted(set(got) ^ set(want)))
    for name, tensor in want.items():
        if precision == "fp32":
            tol = {"rtol": 1e-5, "atol": 1e-6}
        else:
            tol = {"rtol": 0.0, "atol": 4 * torch.finfo(DTYPES[precision]).eps * scale[name]}
        torch.testing.assert_close(got[name].float(), tensor, **tol,
                                   msg=lambda m, n=name: f"{what} {n}: {m}")


def check_bad_arguments(apply, dtype_arg: str) -> None:
    """`apply(module, group, **kwargs)` (the hand-written `apply_fsdp` or torch's
    `apply_fully_shard`, whose compute dtype is called `dtype_arg`) refuses each bad argument with a
    clear error before it looks at the group, and leaves the module as it was."""
    stack = build("stack")
    names = sorted(n for n, _ in stack.named_parameters())
    bad = [
        (TypeError, "wrap must be None", {"wrap": "Linear"}),
        (TypeError, "wrap must be None", {"wrap": 42}),
        (TypeError, "wrap must hold torch.nn.Module subclasses", {"wrap": (nn.Linear, "x")}),
        (TypeError, r"wrap\(name, module\) must return True or False", {"wrap": lambda n, m: 1}),
        (ValueError, "matched no submodule", {"wrap": (nn.Conv2d,)}),
        (TypeError, "has no `.blocks` ModuleList", {"wrap": None}),
        (TypeError, "policy must be a mlsys.policies.PrecisionPolicy", {"policy": 3}),
        (ValueError, "policy='bf16' is not one of", {"policy": "bf16"}),
        (ValueError, "scales its loss", {"policy": policy("bf16_mixed_adamw", low="fp16",
                                                          loss_scale="dynamic")}),
        (ValueError, f"{dtype_arg}=torch.float16 contradicts policy",
         {"policy": "bf16_mixed_adamw", dtype_arg: torch.float16}),
        (ValueError, "reduce_dtype=torch.float32 contradicts policy",
         {"policy": "bf16_mixed_adamw", "reduce_dtype": torch.float32}),
        (TypeError, f"{dtype_arg} must be a floating-point torch.dtype", {dtype_arg: torch.int8}),
    ]
    for error, message, kwargs in bad:
        with pytest.raises(error, match=message):
            apply(stack, None, **{"wrap": (nn.Linear,), **kwargs})
        assert sorted(n for n, _ in stack.named_parameters()) == names
    with pytest.raises(ValueError, match="no parameters to shard"):
        apply(nn.Sequential(nn.ReLU()), None, wrap=())
    # arguments that agree with the policy pass the checks, and reach the group
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        apply(stack, None, wrap=(nn.Linear,), policy="bf16_mixed_adamw",
              **{dtype_arg: torch.bfloat16, "reduce_dtype": torch.bfloat16})
