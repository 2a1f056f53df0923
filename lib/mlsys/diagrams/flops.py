"""Where the FLOPs of a matmul, a linear layer and a transformer block come from (chapter 03).

- `draw_matmul`: C[m, n] = A[m, k] @ B[k, n] as three boxes drawn to scale, B above C and A to its
  left, so that one row of A and one column of B meet at the element of C they make: k multiplies
  and k adds, mn times, 2mnk FLOPs (`accounting.flops.matmul_flops`).
- `linear_passes` / `draw_linear_passes`: a bias-free linear layer's forward Y = X W and the two
  matmuls of its backward, dX = dY W^T and dW = X^T dY, side by side on one scale: the same three
  sizes (tokens, d_in, d_out) in another order each time, so each costs the forward's FLOPs and the
  backward twice the forward (`accounting.flops.linear_backward_flops`).
- `block_passes` / `draw_block_flops`: the nine matmuls of one block of the book's transformer
  (`accounting.flops.layer_flops`), each as a bar of its forward and its backward's two matmuls,
  the gradients of its two operands: 3x the forward, row by row.
FLOPs count a multiply-add as 2, as `mlsys.accounting.flops` does.
"""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.patches import Patch, Rectangle

from mlsys.accounting import flops
from mlsys.book import num
from mlsys.plotting import COLORS, CYCLE, finish, subplots


@dataclass(frozen=True)
class Matmul:
    """One matmul C[m, n] = A[m, k] @ B[k, n] with its operands' names and its FLOPs (2mnk)."""

    a: str
    b: str
    c: str
    m: int
    n: int
    k: int

    @property
    def flops(self) -> int:
        return flops.matmul_flops(self.m, self.n, self.k)


def _box(ax, x: float, y: float, width: float, height: float, name: str, *, color: str,
         gid: str) -> None:
    """A box of `width` x `height` with its top-left corner at (x, y), its name inside."""
    ax.add_patch(Rectangle((x, y - height), width, height, facecolor=color, alpha=0.25,
                           edgecolor=color, lw=1.2, gid=gid))
    ax.text(x + width / 2, y - height / 2, name, ha="center", va="center", fontsize=9)


def draw_matmul(m: int, n: int, k: int, ax=None, *, names: tuple[str, str, str] = ("A", "B", "C"),
                title: str | None = None):
    """C[m, n] = A[m, k] @ B[k, n] drawn to scale (one unit per row or column): B above C, A to
    its left, the edges labelled with their sizes; one row of A, one column of B and the element
    of C they make are marked. The title gives 2mnk. Boxes carry gids "A", "B", "C" whatever
    `names` says. Returns the figure."""
    mm = Matmul(*names, m, n, k)
    total = mm.flops  # checks the sizes: positive ints
    if ax is None:
        _, ax = subplots(width=4.2, height=4.2)
    gap = 0.12 * max(m, n, k)
    _box(ax, -gap - k, 0, k, m, f"{mm.a}\n{m} × {k}", color=CYCLE[0], gid="A")
    _box(ax, 0, gap + k, n, k, f"{mm.b}\n{k} × {n}", color=CYCLE[2], gid="B")
    _box(ax, 0, 0, n, m, f"{mm.c}\n{m} × {n}", color=CYCLE[1], gid="C")
    row, col = 0.12 * m, 0.9 * n  # the marked row of A and column of B meet at C[row, col]
    hi = COLORS["ceiling"]
    ax.add_patch(Rectangle((-gap - k, -row - 0.5), k, 1, color=hi, gid="row of A"))
    ax.add_patch(Rectangle((col - 0.5, gap), 1, k, color=hi, gid="column of B"))
    ax.plot([col], [-row], "o", color=hi, markersize=4)
    ax.plot([-gap, col], [-row, -row], ":", color=hi, lw=0.8)
    ax.plot([col, col], [gap, -row], ":", color=hi, lw=0.8)
    ax.set_xlim(-gap - k - 0.05 * gap, n + 0.05 * gap)
    ax.set_ylim(-m - 0.05 * gap, gap + k + 0.05 * gap)
    ax.set_aspect("equal")
    ax.axis("off")
    finish(ax, title=title or f"{mm.c} = {mm.a} {mm.b}: 2·{m}·{n}·{k} = {num(total)} FLOPs",
           legend=False)
    return ax.figure


def linear_passes(tokens: int, d_in: int, d_out: int) -> list[Matmul]:
    """The three matmuls of a bias-free linear layer Y = X W (X: tokens x d_in, W: d_in x d_out)
    in one training step: the forward, then the backward's dX = dY W^T and dW = X^T dY. Their
    FLOPs are checked against `accounting.flops`: each the forward's, the last two twice it."""
    passes = [Matmul("X", "W", "Y", tokens, d_out, d_in),
              Matmul("dY", "Wᵀ", "dX", tokens, d_in, d_out),
              Matmul("Xᵀ", "dY", "dW", d_in, d_out, tokens)]
    forward = flops.linear_flops(tokens, d_in, d_out)
    if passes[0].flops != forward or passes[1].flops + passes[2].flops != \
            flops.linear_backward_flops(tokens, d_in, d_out):
        raise AssertionError("the drawn passes disagree with accounting.flops")
    return passes


def draw_linear_passes(tokens: int, d_in: int, d_out: int):
    """`linear_passes` drawn side by side by `draw_matmul`, all three on one scale: three shapes
    made of the same three sizes, each 2 * tokens * d_in * d_out FLOPs. Returns the figure."""
    passes = linear_passes(tokens, d_in, d_out)
    fig, axes = subplots(1, 3, width=10.0, height=4.0)
    labels = ("forward", "backward: grad input", "backward: grad weight")
    for ax, mm, label in zip(axes, passes, labels, strict=True):
        draw_matmul(mm.m, mm.n, mm.k, ax, names=(mm.a, mm.b, mm.c),
                    title=f"{label}\n{mm.c} = {mm.a} {mm.b}: {num(mm.flops)} FLOPs")
    # one scale for all three panels: the widest and the tallest extent among them
    width = max(ax.get_xlim()[1] - ax.get_xlim()[0] for ax in axes)
    height = max(ax.get_ylim()[1] - ax.get_ylim()[0] for ax in axes)
    for ax in axes:
        x0, y1 = ax.get_xlim()[0], ax.get_ylim()[1]
        ax.set_xlim(x0, x0 + width)
        ax.set_ylim(y1 - height, y1)
    fig.suptitle(f"A linear layer over {tokens} tokens, {d_in} → {d_out}: backward = "
                 f"{num(passes[1].flops + passes[2].flops)} = 2 × forward", x=0.01, ha="left",
                 fontsize=11)
    return fig


BLOCK_MATMULS = {  # LayerFlops term: (label, its two operands' gradients in the backward)
    "q_proj": ("q_proj  (BT×D)(D×D)", "dX", "dW"),
    "k_proj": ("k_proj  (BT×D)(D×D)", "dX", "dW"),
    "v_proj": ("v_proj  (BT×D)(D×D)", "dX", "dW"),
    "o_proj": ("o_proj  (BT×D)(D×D)", "dX", "dW"),
    "attention_scores": ("scores QKᵀ  (T×d)(d×T) ×BH", "dQ", "dK"),
    "attention_values": ("values PV  (T×T)(T×d) ×BH", "dP", "dV"),
    "ffn_w1": ("ffn w1  (BT×D)(D×F)", "dX", "dW"),
    "ffn_w3": ("ffn w3  (BT×D)(D×F)", "dX", "dW"),
    "ffn_w2": ("ffn w2  (BT×F)(F×D)", "dX", "dW"),
}
"""The block's matmuls in `flops.LayerFlops.MATMUL_TERMS` order, drawn top to bottom."""


def block_passes(cfg, batch: int, seq: int) -> dict[str, tuple[int, int, int]]:
    """Per matmul of one block (`BLOCK_MATMULS`): FLOPs of its forward and of the backward's two
    matmuls, the gradients of its left and right operand; each the forward's (as
    `flops.linear_backward_flops` says of a linear layer, and of the attention matmuls too)."""
    lf = flops.layer_flops(cfg, batch, seq)
    if tuple(BLOCK_MATMULS) != lf.MATMUL_TERMS:
        raise AssertionError("BLOCK_MATMULS is not the block's list of matmuls")
    return {name: (getattr(lf, name),) * 3 for name in BLOCK_MATMULS}


def draw_block_flops(cfg, batch: int, seq: int, ax=None):
    """One block of `cfg` at `batch` x `seq`: each matmul a bar of its forward FLOPs, then its two
    backward matmuls (`block_passes`), in GFLOP; the block's totals in the title. Bars carry gids
    "<term> forward|grad 1|grad 2". Returns the figure."""
    passes = block_passes(cfg, batch, seq)
    if ax is None:
        _, ax = subplots(width=8.5, height=4.2)
    colors = (CYCLE[0], CYCLE[1], CYCLE[2])
    widest = max(sum(parts) for parts in passes.values())
    for row, (name, parts) in enumerate(passes.items()):
        left = 0.0
        for part, value, color in zip(("forward", "grad 1", "grad 2"), parts, colors, strict=True):
            ax.barh(row, value / 1e9, left=left, color=color, height=0.7, gid=f"{name} {part}")
            grad = BLOCK_MATMULS[name][1 if part == "grad 1" else 2] if part != "forward" else ""
            if grad and value > 0.05 * widest:  # named where the name fits
                ax.text(left + value / 2e9, row, grad, ha="center", va="center", fontsize=7,
                        color="white")
            left += value / 1e9
    ax.set_yticks(range(len(passes)), [BLOCK_MATMULS[name][0] for name in passes], fontsize=8)
    ax.invert_yaxis()
    ax.grid(False, axis="y")
    forward = sum(parts[0] for parts in passes.values())
    backward = sum(parts[1] + parts[2] for parts in passes.values())
    handles = [Patch(color=colors[0], label="forward"),
               Patch(color=colors[1], label="backward: grad of the left operand"),
               Patch(color=colors[2], label="backward: grad of the right operand (the weight)")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3,
              frameon=False, fontsize=8)
    finish(ax, title=f"The matmuls of one block (B = {batch}, T = {seq}, D = {cfg.d_model}, "
                     f"F = {cfg.d_ff})\nforward {num(forward / 1e9)} GFLOP, backward "
                     f"{num(backward / 1e9)} GFLOP = 2 × forward",
           xlabel="GFLOP", legend=False)
    return ax.figure

