"""The model's FLOPs by class of operation: the classes a profiler sorts a step's time into.

`CLASSES` are the classes of operation of `mlsys.profiling.classes` (what an op computes: a
matmul, a norm, a softmax, ...). `class_flops` puts `mlsys.accounting.flops.transformer_flops`
into them, so a page can set each class's FLOP share beside its time share (normalization: a
fraction of a percent of the FLOPs, a visible slice of the time; He, "Making Deep Learning Go
Brrrr", 2022). Pure: no torch. Used in: §sec-profiling (chapter 05),
`mlsys.experiments.step_profile`.
"""

from __future__ import annotations

from mlsys import checks
from mlsys.accounting import flops
from mlsys.accounting.attention import BACKENDS

CLASSES = ("matmul", "attention", "elementwise", "normalization", "softmax", "copy/cast",
           "optimizer", "communication", "other")
"""Classes of operation, in the order tables show them; "attention" is a fused kernel (SDPA,
FlashAttention), written-out attention being matmuls, a softmax and elementwise ops."""


def class_flops(cfg, batch: int, seq: int, *, training: bool = False,
                attention: str | None = None) -> dict[str, int]:
    """`mlsys.accounting.flops.transformer_flops` by class: forward FLOPs, or training = 3x
    forward (exact for matmuls, the accounting's estimate for the rest). With written-out
    ("naive") attention the scores and values are matmuls, the scale elementwise and the softmax
    softmax; any other backend (default: `cfg.attention`) is one fused "attention" op. The loss's
    log-softmax over the vocabulary is "softmax" (5 per logit, `flops.softmax_flops`), where the
    profiler puts its time. Not counted: the embedding lookup, the optimizer and copies, which
    get 0."""
    checks.choice(training, "training", (False, True))
    attention = checks.choice(attention or getattr(cfg, "attention", "naive"), "attention",
                              BACKENDS)
    mf = flops.transformer_flops(cfg, batch, seq)
    lf, n = mf.layer, mf.n_layers
    out = dict.fromkeys(CLASSES, 0)
    out["matmul"] = n * (lf.q_proj + lf.k_proj + lf.v_proj + lf.o_proj + lf.ffn_flops) + mf.lm_head
    out["elementwise"] = (n * (lf.rope + lf.swiglu_gate + lf.residual + lf.mlp_activation
                              + lf.biases + lf.routing) + mf.positions)
    out["normalization"] = n * lf.norms + mf.final_norm
    out["softmax"] = flops.softmax_flops(batch * seq, cfg.vocab_size)  # the loss
    core = {"matmul": lf.attention_scores + lf.attention_values,
            "elementwise": lf.attention_scale, "softmax": lf.softmax}
    for cls, value in core.items():
        out[cls if attention == "naive" else "attention"] += n * value
    return {cls: 3 * v if training else v for cls, v in out.items()}
