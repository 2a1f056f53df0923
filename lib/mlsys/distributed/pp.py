"""Pipeline parallelism by hand: stages of consecutive blocks, micro-batches, GPipe and 1F1B with
point-to-point sends (`torch.distributed.pipelining` on the same stages, to compare, is
`torch_strategies.torch_pipeline_step`).

`apply_pp(model, group)` keeps this rank's stage of the model (`PipelineStage`): blocks
`accounting.parallel.stage_layers(...)[stage]`, plus the embedding on the first stage and the final
norm and head on the last; the other blocks are dropped. `pipeline_step` runs one training step on
m micro-batches in the order `accounting.parallel.pipeline_schedule` gives (the one source of the
schedule): a forward receives its input from the previous stage (`recv`) and sends its output on
(`isend`); a backward receives the output's gradient from the next stage and sends its input's
gradient back. The last stage computes the loss of each micro-batch, divided by m, so the
gradients are those of the whole batch's mean loss.

GPipe (Huang et al., 2019) runs every forward, then every backward: m micro-batches of activations
in flight. 1F1B (PipeDream-Flush, Narayanan et al., 2021) runs p - 1 - stage warm-up forwards,
then alternates, so at most p - stage are in flight. Both leave each stage idle for a share
(p - 1) / (m + p - 1) of the step, the bubble (`accounting.parallel.bubble_fraction`).
`PipelineStep` records when each op ran, so the bubble can be measured. Used in: chapter 09.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from mlsys import checks
from mlsys.accounting.parallel import stage_layers
from mlsys.accounting.pipeline import SCHEDULES, pipeline_schedule
from mlsys.distributed.groups import check_group
from mlsys.models.transformer import Transformer, check_tokens


class PipelineStage(nn.Module):
    """One stage of a `Transformer`: (embedding) -> blocks[lo:hi] -> (final norm -> head).

    Tokens (batch, seq) in on the first stage, activations (batch, seq, d_model) elsewhere; logits
    out of the last stage. The modules are the model's own (not copies); names as in the model,
    with blocks numbered from 0 in the stage (`first_block` is the model's number of block 0).
    `group`: the pipeline's process group (`apply_pp` passes it); None only for a stage that is
    inspected, never run (`pipeline_step` refuses it).
    """

    def __init__(self, model: Transformer, stage: int, n_stages: int, group):
        super().__init__()
        if not isinstance(model, Transformer):
            raise TypeError(f"model must be a Transformer, got {type(model).__name__}")
        stages = stage_layers(len(model.blocks), n_stages)
        if checks.integer(stage, "stage", minimum=0) >= n_stages:
            raise ValueError(f"stage ({stage}) must be < n_stages ({n_stages}): stages are "
                             "numbered from 0")
        if group is not None:
            check_group(group)
        lo, hi = stages[stage]
        self.stage, self.n_stages, self.first_block, self.group = stage, n_stages, lo, group
        self.config = model.config
        self.token_embedding = model.token_embedding if stage == 0 else None
        self.rope = model.rope
        self.blocks = nn.ModuleList(model.blocks[lo:hi])
        last = stage == n_stages - 1
        self.final_norm = model.final_norm if last else None
        self.lm_head = model.lm_head if last else None

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.n_stages - 1

    def forward(self, x: Tensor) -> Tensor:
        cos, sin = self.rope(x.shape[1])  # before the embedding, whose output may be split
        if self.is_first:
            check_tokens(x, self.config, ids=x.device.type == "cpu")
            x = self.token_embedding(x)  # (batch, seq, d_model)
        for block in self.blocks:
            x = block(x, cos, sin)
        if self.is_last:
            x = self.lm_head(self.final_norm(x))  # (batch, seq, vocab)
        return x

    def model_name(self, name: str) -> str:
        """The name a parameter of this stage has in the whole model ("blocks.0..." -> "blocks.
        <first_block>...")."""
        if name.startswith("blocks."):
            _, index, rest = name.split(".", 2)
            return f"blocks.{int(index) + self.first_block}.{rest}"
        return name


def apply_pp(model: Transformer, group) -> PipelineStage:
    """This rank's stage of `model`: stage = its rank in `group`, n_stages = the group's size."""
    check_group(group)
    return PipelineStage(model, dist.get_rank(group), dist.get_world_size(group), group)


@dataclass
class PipelineStep:
    """What one `pipeline_step` did on one stage."""

    loss: float | None  # the mean loss over the micro-batches (last stage only)
    order: list[tuple[str, int]]  # ops as run: ("F", i) or ("B", i)
    events: list[tuple[float, float]] = field(default_factory=list)  # (start_s, end_s) per op,
    #   from the step's start (after a barrier), waiting for a receive not included

    @property
    def busy_s(self) -> float:
        return sum(end - start for start, end in self.events)

    @property
    def span_s(self) -> float:
        return self.events[-1][1] if self.events else 0.0


def _stage_rank(stage: PipelineStage, offset: int) -> int:
    return dist.get_global_rank(stage.group, stage.stage + offset)


def pipeline_step(stage: PipelineStage, inputs: Tensor, targets: Tensor, *, microbatches: int,
                  schedule: str = "1f1b", activation_dtype: torch.dtype = torch.float32
                  ) -> PipelineStep:
    """Forward and backward of one step on `stage` (every stage of the group calls it).

    `inputs` (batch, seq) tokens and `targets` (batch, seq) next tokens: every stage passes the
    same, the first reads the inputs, the last the targets, the others only their shape. The
    activations sent between stages are (batch / m, seq, d_model) of `activation_dtype`.
    Gradients accumulate into the stage's parameters; the optimizer step is the caller's.
    """
    if not isinstance(stage, PipelineStage):
        raise TypeError(f"stage must be a PipelineStage (from apply_pp), got "
                        f"{type(stage).__name__}")
    check_group(stage.group, "stage.group")  # no default group: apply_pp(model, group) sets it
    m = checks.positive_int(microbatches, "microbatches")
    checks.choice(schedule, "schedule", SCHEDULES)
    for t, name in ((inputs, "inputs"), (targets, "targets")):
        if not isinstance(t, Tensor) or t.ndim != 2:
            raise ValueError(f"{name} must be a (batch, seq) tensor, got "
                             f"{getattr(t, 'shape', type(t).__name__)}")
    if inputs.shape[0] % m:
        raise ValueError(f"batch ({inputs.shape[0]}) is not divisible by microbatches ({m})")
    shape = (inputs.shape[0] // m, inputs.shape[1], stage.config.d_model)
    x_in, y_in = inputs.chunk(m), targets.chunk(m)
    saved_in: dict[int, Tensor] = {}
    saved_out: dict[int, Tensor] = {}
    sends: list[tuple[object, Tensor]] = []
    total, events, order = 0.0, [], []
    dist.barrier(group=stage.group)
    begin = time.perf_counter()
    for op, i in pipeline_schedule(stage.stage, stage.n_stages, m, schedule):
        if op == "F":
            if stage.is_first:
                x = x_in[i]
            else:
                x = torch.empty(shape, dtype=activation_dtype, device=inputs.device)
                dist.recv(x, src=_stage_rank(stage, -1), group=stage.group)
                x.requires_grad_(True)
            start = time.perf_counter()
            y = stage(x)
            if stage.is_last:
                y = F.cross_entropy(y.flatten(0, 1).float(), y_in[i].flatten()) / m
                total += y.item()
            else:
                out = y.detach().contiguous()
                sends.append((dist.isend(out, dst=_stage_rank(stage, 1), group=stage.group), out))
            saved_in[i], saved_out[i] = x, y
        else:
            if stage.is_last:
                start = time.perf_counter()
                saved_out.pop(i).backward()
            else:
                grad = torch.empty(shape, dtype=activation_dtype, device=inputs.device)
                dist.recv(grad, src=_stage_rank(stage, 1), group=stage.group)
                start = time.perf_counter()
                saved_out.pop(i).backward(grad)
            x = saved_in.pop(i)
            if not stage.is_first:
                back = x.grad.contiguous()
                sends.append((dist.isend(back, dst=_stage_rank(stage, -1), group=stage.group),
                              back))
        events.append((start - begin, time.perf_counter() - begin))
        order.append((op, i))
    for work, _ in sends:
        work.wait()
    return PipelineStep(total if stage.is_last else None, order, events)
