"""Chapter 03's live checks (not recorded experiments): the FLOP formulas of `accounting.flops`
against formulas written out independently and against PyTorch's own counter
(`torch.utils.flop_counter`, through `models.counting`) on the real model, built on the meta device.

- `block_table`: one transformer block's forward FLOPs by component, each term of
  `flops.layer_flops` asserted equal to its formula evaluated here (`BLOCK_FORMULAS`);
- `preset_counts`: the whole model's forward (and, for some presets, forward + backward) counted
  and asserted equal to `flops.transformer_flops`, preset by preset;
- `six_n_table` and `plot_six_n`: the detailed count per token against the 6N rule;
- `claimed_checks`: three per-layer formulas that circulate, against the counter on real modules.
Every function asserts what it shows: a formula that disagrees stops the page. Counts are FLOPs
(a multiply-add is 2). Used in: §sec-flops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from mlsys import plotting
from mlsys.accounting import flops
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
