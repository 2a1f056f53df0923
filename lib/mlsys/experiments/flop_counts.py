"""Chapter 03's live checks (not recorded experiments): the FLOP formulas of `accounting.flops`
against formulas written out independently and against PyTorch's own counter
(`torch.utils.flop_counter`, through `models.counting`) on the real model, built on the meta device.

- `block_table`: one transformer block's forward FLOPs by component, each term of
  `flops.layer_flops` asserted equal to its formula evaluated here (`BLOCK_FORMULAS`);
- `preset_counts`: the whole model's forward (and, for some presets, forward + backward) counted
  and asserted equal to `flops.transformer_flops`, preset by preset;
- `six_n_table` and `plot_six_n`: the detailed count per token against the 6N rule;
- `claimed_checks`: three per-layer formulas that circulate, against the counter on real modules;
- `causal_table`: the training FLOPs per token under each causal convention
  (`accounting.attention.CAUSAL_CONVENTIONS`), and what each does to a reported MFU;
- `recompute_table`: HFU / MFU under three recomputation conventions (a whole extra forward,
  Megatron-LM's full recompute of the blocks, PyTorch's non-reentrant checkpoint, which stops
  early);
- `decode_table`: the FLOPs of generating one token with a KV cache, counted (`decode_flops`);
- `published_mfu_table`: the utilizations large runs reported (`third_party.PUBLISHED_MFU`) beside
  the ones measured here.
A little over 300 lines: every check of chapter 03, each a function the page calls.
Every function asserts what it shows: a formula that disagrees stops the page. Counts are FLOPs
(a multiply-add is 2). Used in: §sec-flops.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from mlsys import plotting, third_party
from mlsys.accounting import attention, flops, recompute, utilization
from mlsys.accounting.params import count_params, param_counts
from mlsys.book import Table, num
from mlsys.models.config import TransformerConfig
from mlsys.models.counting import count_model_flops

BLOCK_FORMULAS = {  # component: (formula as text, the same formula in B, T, D, H, F)
    "q_proj": ("2·B·T·D²", lambda B, T, D, H, F: 2 * B * T * D * D),
    "k_proj": ("2·B·T·D²", lambda B, T, D, H, F: 2 * B * T * D * D),
    "v_proj": ("2·B·T·D²", lambda B, T, D, H, F: 2 * B * T * D * D),
    "o_proj": ("2·B·T·D²", lambda B, T, D, H, F: 2 * B * T * D * D),
    "attention_scores": ("2·B·T²·D", lambda B, T, D, H, F: 2 * B * T * T * D),
    "attention_values": ("2·B·T²·D", lambda B, T, D, H, F: 2 * B * T * T * D),
    "ffn_w1": ("2·B·T·D·F", lambda B, T, D, H, F: 2 * B * T * D * F),
    "ffn_w3": ("2·B·T·D·F", lambda B, T, D, H, F: 2 * B * T * D * F),
    "ffn_w2": ("2·B·T·F·D", lambda B, T, D, H, F: 2 * B * T * F * D),
    # elementwise estimates: norms 4 per element (x2 norms), RoPE 3 (q and k), scale 1 and
    # softmax 5 per score, SwiGLU's gate 6 per hidden unit, two residual adds
    "norms": ("2·4·B·T·D", lambda B, T, D, H, F: 2 * 4 * B * T * D),
    "rope": ("2·3·B·T·D", lambda B, T, D, H, F: 2 * 3 * B * T * D),
    "attention_scale": ("1·B·H·T²", lambda B, T, D, H, F: B * H * T * T),
    "softmax": ("5·B·H·T²", lambda B, T, D, H, F: 5 * B * H * T * T),
    "swiglu_gate": ("6·B·T·F", lambda B, T, D, H, F: 6 * B * T * F),
    "residual": ("2·B·T·D", lambda B, T, D, H, F: 2 * B * T * D),
}
"""Every term of `flops.LayerFlops`, written out apart from the library (B batch, T tokens,
D d_model, H heads, F d_ff)."""


def block_table(cfg: TransformerConfig, batch: int, seq: int) -> Table:
    """One block's forward FLOPs by component (GFLOP and share of the block), each term of
    `flops.layer_flops` asserted equal to its `BLOCK_FORMULAS` entry."""
    lf = flops.layer_flops(cfg, batch, seq)
    total = lf.matmul_flops + lf.elementwise_flops
    rows = []
    for name, value in lf.as_dict().items():
        text, formula = BLOCK_FORMULAS[name]
        assert value == formula(batch, seq, cfg.d_model, cfg.n_heads, cfg.d_ff), name
        kind = "matmul" if name in lf.MATMUL_TERMS else "elementwise (est.)"
        rows.append([f"`{name}`", kind, text, f"{value / 1e9:,.3f}", f"{value / total:.1%}"])
    rows.append(["block", "", "", f"{total / 1e9:,.3f}", "100%"])
    return Table(["component", "kind", "formula", "GFLOP", "share"], rows)


def preset_counts(presets: Sequence[str], batch: int, seq: int,
                  backward: Sequence[str]) -> tuple[Table, dict[str, int]]:
    """Per preset: the forward's matmul FLOPs, analytic and counted (asserted equal, shown once),
    and for the presets in `backward` the forward + backward counted (asserted equal to the
    analytic 3x the forward). Returns the table and the counted forward of each preset."""
    rows, counted = [], {}
    for name in presets:
        cfg = TransformerConfig.preset(name)
        predicted = flops.transformer_flops(cfg, batch, seq)
        forward = count_model_flops(cfg, batch, seq).get_total_flops()
        assert forward == predicted.forward_matmul_flops, name
        counted[name] = forward
        row = [f"`{name}`", num(forward / 1e9, 4)]
        if name in backward:
            both = count_model_flops(cfg, batch, seq, backward=True).get_total_flops()
            assert both == predicted.training_matmul_flops == 3 * forward
            row += [num(both / 1e9, 4), f"{both / forward:g}"]
        else:
            row += ["(not run in this profile)", ""]
        rows.append(row)
    return Table(["preset", "forward GFLOP (analytic = counter)", "fwd + bwd GFLOP (counter)",
                  "fwd + bwd / fwd"], rows), counted


def six_n_table(presets: Sequence[str]) -> Table:
    """Per preset at its context length: N and N_matmul (millions), 6N and the detailed count per
    token (asserted equal to 6 N_matmul + 12 L T D), and their ratio."""
    rows = []
    for name in presets:
        cfg = TransformerConfig.preset(name)
        seq, pc = cfg.context_length, param_counts(cfg)
        detailed = flops.training_flops_per_token(cfg, seq)
        assert detailed == 6 * pc.matmul + 12 * cfg.n_layers * seq * cfg.d_model  # the formula
        six_n = flops.six_n_flops_per_token(pc.total)
        rows.append([f"`{name}`", f"{seq:,}", num(pc.total / 1e6), num(pc.matmul / 1e6),
                     num(six_n / 1e9), num(detailed / 1e9), f"{detailed / six_n:.3f}"])
    return Table(["preset", "T (its context)", "N (M)", "N_matmul (M)", "6N (GFLOP/token)",
                  "detailed (GFLOP/token)", "detailed / 6N"], rows)


def plot_six_n(presets: Sequence[str], ax, *, seqs: Sequence[int], counted: dict[str, int],
               batch: int, seq: int, shape_70b: TransformerConfig) -> None:
    """Detailed training FLOPs per token / 6N against the length, per preset and for a 70B shape;
    the counter's forward x 3 per token (`counted`, at `batch` x `seq`) as diamonds."""
    for color, name in zip(plotting.CYCLE, presets, strict=False):
        cfg = TransformerConfig.preset(name)
        ax.plot(seqs, [flops.six_n_ratio(cfg, s) for s in seqs], marker=".", color=color,
                label=name)
        if name in counted:  # the counter's forward x 3, per token, at the counter's sequence
            per_token = 3 * counted[name] / (batch * seq)
            ax.plot(seq, per_token / (6 * count_params(cfg)), "D", color=color,
                    markeredgecolor="white", markersize=7)
    ax.plot(seqs, [flops.six_n_ratio(shape_70b, s) for s in seqs], ":",
            color=plotting.COLORS["ceiling"], label="70B shape")
    ax.plot([], [], "D", color=plotting.COLORS["muted"], label="counter (forward × 3)")
    ax.axhline(1.0, color=plotting.COLORS["ceiling"], lw=1, linestyle="--", label="6N")
    plotting.finish(ax, title="Detailed training FLOPs per token / 6N",
                    xlabel="sequence length T (tokens)", ylabel="detailed / 6N", logx=2,
                    logy=True)
    ax.legend(ncol=2, fontsize=8)


def plot_shares(presets: Sequence[str], ax, *, seq: int) -> None:
    """Where each preset's forward FLOPs go at `seq` tokens (`flops.forward_shares`), in %."""
    shares = {name: flops.forward_shares(TransformerConfig.preset(name), seq) for name in presets}
    parts = {group: [100 * shares[name][group] for name in presets]
             for group in shares[presets[0]]}
    plotting.stacked_bars(ax, list(presets), parts, ylabel="share of forward FLOPs (%)")
    plotting.finish(ax, title=f"Where the forward FLOPs go (sequence {seq})", legend=False)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)


def _counted(module: torch.nn.Module, x: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter:
        module(x)
    return counter.get_total_flops()


def claimed_checks(cfg: TransformerConfig, batch: int, seq: int,
                   block: dict[str, dict[Any, int]]) -> dict[str, tuple[str, int, str, int, int]]:
    """Name -> (claimed formula, its value, the correct formula, its value, the counter) for a
    D x D linear layer, the attention sub-layer and the SwiGLU feed-forward of `cfg`
    (`block`: the counter's per-module counts at `batch` x `seq`) and a two-matrix GELU MLP, the
    linear and the MLP counted here on the meta device. Asserts each correct formula equals the
    counter, and how each claim is off."""
    B, T, D, H, Fd = batch, seq, cfg.d_model, cfg.n_heads, cfg.d_ff
    with torch.device("meta"):
        linear = _counted(torch.nn.Linear(D, D, bias=False), torch.zeros(B, T, D))
        mlp = _counted(torch.nn.Sequential(torch.nn.Linear(D, Fd, bias=False), torch.nn.GELU(),
                                           torch.nn.Linear(Fd, D, bias=False)),
                       torch.zeros(B, T, D))
    checks = {
        "linear (D x D)": ("2·B·D_in·D_out", flops.claimed_linear_flops(B, D, D),
                           "2·B·T·D_in·D_out", 2 * B * T * D * D, linear),
        "attention sub-layer": ("2·B·T·D·(4D + 2T·H)",
                                flops.claimed_attention_flops(B, T, D, H),
                                "2·B·T·D·(4D + 2T)", 2 * B * T * D * (4 * D + 2 * T),
                                sum(block["Transformer.blocks.0.attn"].values())),
        "SwiGLU feed-forward": ("4·B·T·D·F", flops.claimed_ffn_flops(B, T, D, Fd),
                                "6·B·T·D·F", 6 * B * T * D * Fd,
                                sum(block["Transformer.blocks.0.ffn"].values())),
        "two-matrix MLP (GELU)": ("4·B·T·D·F", flops.claimed_ffn_flops(B, T, D, Fd),
                                  "4·B·T·D·F", 4 * B * T * D * Fd, mlp),
    }
    for name, (_, _, _, fixed, count) in checks.items():
        assert fixed == count, name
    assert checks["linear (D x D)"][1] * T == linear  # short by the factor T
    assert checks["attention sub-layer"][1] != checks["attention sub-layer"][4]
    assert 3 * checks["SwiGLU feed-forward"][1] == 2 * checks["SwiGLU feed-forward"][4]
    assert checks["two-matrix MLP (GELU)"][1] == mlp  # right for two matrices
    return checks


def claimed_table(checks: dict[str, tuple[str, int, str, int, int]]) -> Table:
    """`claimed_checks` as a table: each claim, claimed / counter, the correct formula."""
    return Table(["layer", "claimed", "claimed / counter", "correct", "counter (= correct)"],
                 [[name, claim, f"{claimed / count:.4g}", fix, f"{count:,}"]
                  for name, (claim, claimed, fix, _, count) in checks.items()])


# --- conventions: the causal mask, recomputation ------------------------------------------------


def causal_flops_per_token(cfg: TransformerConfig, seq: int) -> dict[str, float]:
    """Training FLOPs per token at `seq` under each causal convention of
    `attention.CAUSAL_CONVENTIONS`: 6 N_matmul plus 3 forwards of the two attention matmuls over
    the pairs the convention counts (dense: all T^2, asserted equal to
    `flops.training_flops_per_token`; half: T^2 / 2; exact: T (T + 1) / 2)."""
    n_matmul = param_counts(cfg).matmul
    out = {}
    for convention in attention.CAUSAL_CONVENTIONS:
        forward = attention.attention_forward_flops(1, cfg.n_heads, seq, seq, cfg.d_head,
                                                    causal=True, convention=convention)
        out[convention] = 6 * n_matmul + 3 * cfg.n_layers * forward / seq
    assert out["dense"] == flops.training_flops_per_token(cfg, seq)
    assert out["dense"] - out["half"] == 6 * cfg.n_layers * seq * cfg.d_model  # 12 LTD -> 6 LTD
    return out


def causal_table(cases: Sequence[tuple[str, TransformerConfig, int]], mfu: float) -> Table:
    """Per (name, config, seq): GFLOP per token under each causal convention, and the MFU that a
    run measured at `mfu` with the dense count reports under each (model FLOPs scale it)."""
    order = ("dense", "half", "exact")
    rows = []
    for name, cfg, seq in cases:
        per = causal_flops_per_token(cfg, seq)
        rows.append([name, f"{seq:,}", *(num(per[c] / 1e9, 4) for c in order),
                     *(f"{mfu * per[c] / per['dense']:.1%}" for c in order)])
    return Table(["model", "T", *(f"GFLOP/token, {c}" for c in order),
                  *(f"MFU, {c}" for c in order)], rows)


RECOMPUTE_CONVENTIONS = (
    "none",
    "a whole extra forward, head included (the 4/3 rule)",
    "every block rerun, the head not (Megatron-LM's full recompute)",
    "every block rerun until its saved tensors are back (PyTorch)",
)


def recompute_ratios(cfg: TransformerConfig, batch: int, seq: int) -> dict[str, float]:
    """HFU / MFU of one training step under each of `RECOMPUTE_CONVENTIONS`: executed matmul FLOPs
    over the model's (3 forwards). A whole extra forward gives 4/3
    (`utilization.hardware_training_flops`); Megatron-LM's full recomputation reruns every block
    but not the output head (its FLOP formula, 96 B s l h^2 (1 + s / 6h + V / 16lh), keeps the
    head at 6 B s h V: Narayanan et al. 2021); PyTorch's non-reentrant checkpoint of each block
    also stops early, skipping each block's last w2 (`accounting.recompute`)."""
    full = utilization.hardware_training_flops(1.0, recompute="full")
    whole, early = (recompute.recompute_overhead(cfg, batch, seq, checkpoint_segment=1,
                                                 early_stop=stop) for stop in (False, True))
    ratios = (1.0, full / utilization.hardware_training_flops(1.0), 1 + whole, 1 + early)
    assert ratios[0] < ratios[3] < ratios[2] < ratios[1]
    return dict(zip(RECOMPUTE_CONVENTIONS, ratios, strict=True))


def recompute_table(cfg: TransformerConfig, batch: int, seq: int, mfu: float) -> Table:
    """`recompute_ratios` as a table: the share of the step recomputed, HFU / MFU, and the HFU a
    run at `mfu` would report under each convention."""
    return Table(["recomputation", "recomputed / model FLOPs", "HFU / MFU",
                  f"HFU at {mfu:.0%} MFU"],
                 [[name, f"{r - 1:.1%}", f"{r:.3f}", f"{r * mfu:.1%}"]
                  for name, r in recompute_ratios(cfg, batch, seq).items()])


# --- decoding with a KV cache --------------------------------------------------------------------


def _cached_attention_flops(cfg: TransformerConfig, context: int) -> int:
    """What `FlopCounterMode` counts for one query against `context` cached keys and values, all
    heads: the scores q k^T and the weighted values p v, on the meta device."""
    h, dh = cfg.n_heads, cfg.d_head
    with torch.device("meta"), FlopCounterMode(display=False) as counter:
        q, k, v = torch.zeros(1, h, 1, dh), torch.zeros(1, h, context, dh), torch.zeros(
            1, h, context, dh)
        (q @ k.transpose(-2, -1)) @ v  # (1, h, 1, context) scores, then (1, h, 1, dh)
    return counter.get_total_flops()


@functools.cache
def _one_token_flops(cfg: TransformerConfig) -> int:
    """The counter's forward FLOPs of one token through the model (it attends itself only)."""
    return count_model_flops(cfg, 1, 1).get_total_flops()


def decode_flops(cfg: TransformerConfig, context: int) -> dict[str, int]:
    """Forward matmul FLOPs of generating one token when the keys and values of the `context`
    positions it attends (itself included) are cached: every weight once, 2 N_matmul, and the two
    attention matmuls over the cache, 4 L D context. Counted: one token through the model on the
    meta device (it attends itself only), plus per layer the counter's cached-attention FLOPs at
    `context` less those at 1; asserted equal to the formula."""
    if not 1 <= context <= cfg.context_length:
        raise ValueError(f"context must be in [1, {cfg.context_length}] (the model's context "
                         f"length), got {context}")
    weights = 2 * param_counts(cfg).matmul
    cached = 4 * cfg.n_layers * cfg.d_model * context
    counted = _one_token_flops(cfg) + cfg.n_layers * (_cached_attention_flops(cfg, context)
                                          - _cached_attention_flops(cfg, 1))
    assert counted == weights + cached
    return {"weights": weights, "attention": cached, "total": counted}


def decode_table(cfg: TransformerConfig, contexts: Sequence[int]) -> Table:
    """Per context: one decoded token's GFLOP with the cache (`decode_flops`), the attention's
    share, and what re-running the forward over the whole prefix would cost instead (no cache:
    the dense forward of `flops.transformer_flops`). Asserts that a decoded token at context t
    costs a third of a training token at sequence t (both count t keys per query: 2 N + 4 L D t
    against 6 N + 12 L t D)."""
    rows = []
    for context in contexts:
        d = decode_flops(cfg, context)
        prefix = flops.transformer_flops(cfg, 1, context).forward_matmul_flops
        assert 3 * d["total"] == flops.training_flops_per_token(cfg, context)
        rows.append([f"{context:,}", num(d["total"] / 1e9, 4), f"{d['attention'] / d['total']:.1%}",
                     num(prefix / 1e9, 4), f"{prefix / d['total']:,.0f}x"])
    return Table(["context t", "GFLOP per decoded token (KV cache)", "attention share",
                  "no cache: the prefix's forward (GFLOP)", "no cache / cache"], rows)


# --- published utilizations ----------------------------------------------------------------------


def published_mfu_table(measured: Sequence[tuple[str, str, float, str]]) -> Table:
    """`third_party.PUBLISHED_MFU` row by row, then this book's `measured` rows: (run, chips, MFU,
    what the MFU is measured against)."""
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    rows = [[r.run, f"{r.chips:,} {r.accelerator}" if r.chips else r.accelerator, pct(r.mfu),
             pct(r.hfu), r.note, r.source] for r in third_party.PUBLISHED_MFU]
    rows += [[run, chips, pct(mfu), "-", against, "this book"]
             for run, chips, mfu, against in measured]
    return Table(["run", "chips", "MFU", "HFU", "note", "source"], rows)
