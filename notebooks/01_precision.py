# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# (sec-precision)=
# # Number formats and precision
#
# **Question.** Add 0.01 to a running sum 1000 times in fp32, fp16 and bf16: which format lands farthest
# from 10, by how much, and can we predict every digit of the answer before running it?

# %% tags=["remove-cell"]
# Colab or a fresh kernel: install the book's library when it is missing (a no-op in the book's own environment).
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("mlsys") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+https://github.com/mlsys-book/mlsys-book.git"], check=True)

# %%
from mlsys import env

print(env.describe())

# %%
import math

import matplotlib.pyplot as plt
import torch
from IPython.display import display

from mlsys import precision as P
from mlsys import summation as S
from mlsys.book import Table, glue, num
from mlsys.plotting import COLORS, CYCLE, finish, subplots

# %% tags=["parameters"]
SEED = 0
ADDEND, N_TERMS = 0.01, 1000  # the experiment everyone quotes
SMALL_ADDEND, N_SMALL = 0.001, 10_000  # its smaller-step cousin
DOT_LENGTHS = env.pick(smoke=[16, 64, 256, 1024, 2048], cpu=[16, 64, 256, 1024, 4096, 8192],
                       gpu=[16, 64, 256, 1024, 4096, 16384])  # K of the dot-product experiment
DOT_ROWS = env.pick(smoke=64, cpu=256, gpu=1024)  # independent dot products per K
SR_CHAINS = env.pick(smoke=32, cpu=128, gpu=512)  # independent stochastic-rounding runs (exercise)


# %% [markdown]
# ## Seven formats from two numbers
#
# A binary floating-point number is a sign, an exponent field $E$ of $e$ bits and a mantissa field $M$ of
# $m$ bits. A normal number is $(-1)^S \, 2^{E-\text{bias}} \, (1 + M/2^m)$ with
# $\text{bias} = 2^{e-1}-1$; when $E=0$ the leading 1 is dropped and the number is *subnormal*,
# $2^{1-\text{bias}}\,(M/2^m)$. IEEE 754 {cite}`ieee754_2019` reserves the all-ones exponent for
# infinities and NaN. The fp8 format e4m3 {cite}`micikevicius2022fp8` gives that exponent back to finite
# numbers and keeps only one NaN pattern, so it has no infinity and its largest value is $1.75 \cdot 2^8$.
# tf32 is not a storage type at all: it is what NVIDIA tensor cores read from an fp32 operand, fp32's 8
# exponent bits with fp16's 10 mantissa bits {cite}`nvidia_a100_datasheet`.
#
# Everything in the table below is derived from $(e, m)$ and that convention by `FloatFormat`, then checked
# against `torch.finfo` for every format torch has.
#
# ```{literalinclude} ../lib/mlsys/precision.py
# :pyobject: FloatFormat
# ```

# %%
rows = P.format_table()
for row in rows:  # the derived values are torch's own
    if row["torch_dtype"] != "-":
        info = torch.finfo(getattr(torch, row["torch_dtype"]))
        assert (row["bits"], row["max"], row["smallest_normal"], row["eps"]) == (
            info.bits, info.max, info.smallest_normal, info.eps)
fp16, bf16, fp32 = P.FORMATS["fp16"], P.FORMATS["bf16"], P.FORMATS["fp32"]
assert fp16.max == (2 - 2**-10) * 2**15 and P.FORMATS["fp8_e4m3"].max == 1.75 * 2**8
glue("fp16_max", fp16.max)
glue("fp16_subnormal", fp16.smallest_subnormal)
glue("bf16_subnormal", bf16.smallest_subnormal)
Table(["format", "bits", "exp", "mant", "bias", "max", "smallest normal", "smallest subnormal", "eps", "inf?",
       "torch dtype"],
      [[r["format"], r["bits"], r["exponent_bits"], r["mantissa_bits"], r["bias"], num(r["max"], 6),
        num(r["smallest_normal"], 6), num(r["smallest_subnormal"], 6), num(r["eps"], 6),
        "yes" if r["infinities"] else "no", r["torch_dtype"]] for r in rows])

# %% [markdown]
# Range comes from the exponent bits, precision from the mantissa bits. bf16 keeps fp32's range (8 exponent
# bits) and pays with precision: its eps, the gap after 1, is $2^{-7}$ against fp16's $2^{-10}$. That trade
# decides the accumulation experiment below.
#
# ### The bits of a few numbers
#
# `decompose` rounds a number to a format and splits the stored value into its fields; the chapter checks
# each pattern against the bits torch stores.

# %%
SAMPLES = [1.0, 0.1, -2.5, 0.01, 65504.0, 1e-8]
BIT_FORMATS = ["fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]
INT_VIEW = {8: torch.uint8, 16: torch.int16, 32: torch.int32}
bit_rows = []
for x in SAMPLES:
    for name in BIT_FORMATS:
        b, f = P.decompose(x, name), P.FORMATS[name]
        stored = torch.tensor([x], dtype=torch.float32).to(f.dtype).view(INT_VIEW[f.bits]).item() % 2**f.bits
        assert int(b.pattern.replace(" ", ""), 2) == stored and b.reconstruct() == b.value
        exponent = "-" if b.unbiased_exponent is None else b.unbiased_exponent
        bit_rows.append([x, name, b.pattern, b.kind, exponent, repr(b.value)])
glue("e4m3_max", P.FORMATS["fp8_e4m3"].max)
glue("fp16_max_in_bf16", P.round_to(fp16.max, "bf16"))
Table(["x", "format", "sign exponent mantissa", "kind", "E - bias", "stored value"], bit_rows)

# %% [markdown]
# Three things to read off: 0.1 is not stored as 0.1 in any binary format (its mantissa is a repeating
# pattern cut off after $m$ bits); {glue:text}`fp16_max:.0f` is fp16's largest number (exponent field all
# ones minus one, mantissa all ones), which e4m3 saturates to {glue:text}`e4m3_max:.0f` and bf16 rounds to
# {glue:text}`fp16_max_in_bf16:.0f`; $10^{-8}$ is below fp16's smallest subnormal and becomes 0, while bf16
# stores it.
#
# ### Spacing grows with magnitude
#
# Between $2^E$ and $2^{E+1}$ the numbers of a format are evenly spaced by $\text{ulp} = 2^{E-m}$ (unit in
# the last place); below the smallest normal the spacing stays at the subnormal step. The relative spacing
# is therefore between $2^{-m-1}$ and $2^{-m}$ everywhere in the normal range. `ulp` computes it; the
# markers are measured as the gap from a torch value to the next bit pattern.

# %%
lo, hi = -26, 17
grid = [2.0 ** (lo + (hi - lo) * i / 1999) for i in range(2000)]
fig, ax = subplots(width=7.0, height=4.2)
styles = {"tf32": (0, (4, 2))}
line_colors = dict(zip(P.FORMATS, CYCLE, strict=False))
for name, f in P.FORMATS.items():
    xs = [x for x in grid if f.smallest_subnormal <= x <= f.max]
    ax.plot(xs, [P.ulp(x, f) for x in xs], color=line_colors[name], lw=1.4, ls=styles.get(name, "-"),
            label=f"{name} (ulp)")
for name in ["fp32", "fp16", "bf16"]:
    dtype, f, color = P.FORMATS[name].dtype, P.FORMATS[name], line_colors[name]
    probe = torch.tensor([2.0**k for k in range(lo, hi, 3) if 2.0**k <= f.max], dtype=dtype)
    view = INT_VIEW[f.bits]
    gap = ((probe.view(view) + 1).view(dtype).double() - probe.double()).tolist()
    assert gap == [P.ulp(x, name) for x in probe.double().tolist()]
    ax.plot(probe.double().tolist(), gap, "o", color=color, ms=5, mfc="none", label=f"{name} measured gap")
finish(ax, title="Spacing of representable numbers", xlabel="|x|", ylabel="ulp(x)", logx=2, logy=2)
ax.legend(ncol=2, fontsize=8)
plt.show()
spacing_ratio = glue("bf16_over_fp16_spacing", P.ulp(1.0, "bf16") / P.ulp(1.0, "fp16"))
assert spacing_ratio == 2 ** (fp16.mantissa_bits - bf16.mantissa_bits)

# %% [markdown]
# fp16 and tf32 share one staircase (10 mantissa bits) until fp16 runs out of exponent; bf16's staircase
# sits {glue:text}`bf16_over_fp16_spacing:.0f` times higher than fp16's wherever both are normal.
#
# ### Underflow, overflow and rounding to nearest even

# %%
tiny = torch.tensor(1e-8)
underflow = {"fp16": tiny.half().item(), "bf16": tiny.bfloat16().item()}
assert underflow["fp16"] == 0.0 and underflow["bf16"] == P.round_to(1e-8, "bf16") != 0.0
x = torch.tensor([200.0, 255.0, 255.875, 256.0, 300.0], dtype=torch.float16)
squares = (x * x).tolist()
overflow_threshold = math.sqrt(fp16.max + P.ulp(fp16.max, "fp16") / 2)  # x*x rounds to inf above this
assert all(math.isinf(s) == (v > overflow_threshold) for s, v in zip(squares, x.tolist(), strict=True))
glue("sqrt_fp16_max", overflow_threshold)
ties = torch.tensor([2049.0, 2050.0, 2051.0, 2053.0], dtype=torch.float32)
rounded = ties.half().tolist()
assert rounded == [P.round_to(v, "fp16") for v in ties.tolist()] == [2048.0, 2050.0, 2052.0, 2052.0]
print(f"1e-8 stored: fp16 {underflow['fp16']}, bf16 {underflow['bf16']!r}")
print("fp16 x*x:", dict(zip(x.tolist(), squares, strict=True)))
print("fp16 rounding of odd integers above 2048 (spacing 2):", dict(zip(ties.tolist(), rounded, strict=True)))

# %% [markdown]
# fp16 stores nothing below {glue:text}`fp16_subnormal:.3g`, so $10^{-8}$ underflows to zero (bf16 goes down
# to {glue:text}`bf16_subnormal:.1e`). Its largest number is {glue:text}`fp16_max:.0f`, so a square overflows to `inf` once
# $x > $ {glue:text}`sqrt_fp16_max:.5g` (the square must stay below $65504 + \text{ulp}/2 = 65520$, the tie
# that rounds up to $2^{16}$). Between 2048 and 4096 the spacing is 2: 2049 and 2051 are exactly halfway,
# and *round to nearest, ties to even* sends them to the neighbour whose last mantissa bit is 0 (2048 and
# 2052). `round_to` does this with exact rational arithmetic and agrees with torch's casts bit for bit
# (the tests check every tie of both fp8 formats and thousands of fp16 and bf16 ties).
#
# One trap: torch converts float64 to fp16 or bf16 by way of fp32, which can round twice.

# %%
x = 1 + 2**-11 + 2**-40  # just above the midpoint between fp16's 1 and 1 + 2^-10
once, twice = P.round_to(x, "fp16"), P.round_to(P.round_to(x, "fp32"), "fp16")
by_torch = torch.tensor(x, dtype=torch.float64).to(torch.float16).item()
verdict = ("the value rounded twice (to fp32 first, where the 2^-40 is lost and a tie appears)"
           if by_torch == twice != once else "the correctly rounded value")
glue("double_round_torch", repr(by_torch))
glue("double_round_verdict", verdict)
print(f"correctly rounded {once!r}, rounded via fp32 {twice!r}, torch {by_torch!r}")

# %% [markdown]
# Here torch gives {glue:text}`double_round_torch`, {glue:text}`double_round_verdict`. Test rounding code
# against casts from fp32, as this chapter's tests do, not from float64.
#
# ## Napkin math: where a running sum stops
#
# Take a running sum $s \leftarrow \text{round}(s + a)$. Inside a binade $[2^E, 2^{E+1})$ the sum is a
# whole number $k$ of ulps $u = 2^{E-m}$, so each addition adds exactly $\text{round}(a/u)$ ulps: the same
# amount every step, which is usually *not* $a$. Once $a < u/2$ that is zero ulps and the sum never moves
# again. The first binade where this happens starts at
#
# $$ s^* = 2^{\lfloor \log_2 a \rfloor + m + 2}, $$
#
# and the sum arrives there exactly: in the binade below, $a \ge u/2$ still, and the step that crosses
# $s^*$ rounds onto it. (For $a = 2^p$ the tie rule stops the sum one binade earlier, at $2^{p+m+1}$.)
# The plateau depends on the mantissa bits only, not on the range: bf16 has fp32's range and 3 fewer
# mantissa bits than fp16, so it freezes {glue:text}`bf16_over_fp16_spacing:.0f` times lower than fp16. `plateau_value` is this formula;
# `plateau_sum` walks the binades one by one and predicts every partial sum exactly.

# %%
napkin_rows = []
for name, f in P.FORMATS.items():
    stored = P.round_to(ADDEND, f)
    s_star = S.plateau_value(stored, f)
    walk = S.plateau_sum(ADDEND, 10**18, f)  # a binade walk: cheap even for 10^18 additions
    assert walk.final == s_star and walk.stall_step is not None
    napkin_rows.append([name, repr(stored), num(P.ulp(s_star, f), 6), num(s_star, 6), f"{walk.stall_step:,}"])
    glue(f"plateau_{name}", s_star)
    glue(f"stall_{name}", walk.stall_step)
Table(["format", f"{ADDEND} stored as", "ulp at plateau", "plateau s*", "additions that count"], napkin_rows)

# %% [markdown]
# The ulp at the plateau is the same in every format: the sum freezes where the spacing first exceeds twice
# the addend, and only the magnitude at which that happens depends on $m$.
#
# So with 1000 additions of 0.01 (intended sum 10), the prediction before measuring anything is: fp32 and fp16
# never reach their plateaus ({glue:text}`plateau_fp32:,.0f` and {glue:text}`plateau_fp16:.0f`), bf16
# freezes at {glue:text}`plateau_bf16:.0f` after {glue:text}`stall_bf16` additions. The remaining error of
# fp32 and fp16 comes from each step adding $\text{round}(a/u)\,u$ instead of $a$.
#
# ## The code
#
# ```{literalinclude} ../lib/mlsys/summation.py
# :pyobject: plateau_value
# ```
#
# ```{literalinclude} ../lib/mlsys/summation.py
# :pyobject: plateau_sum
# ```
#
# The measurement is deliberately plain: one torch addition per step on a 0-d tensor, the addend stored by
# torch's own cast. `explicit_cast=True` writes `acc += x.to(acc.dtype)` instead of relying on type promotion
# in `acc += x`.
#
# ```{literalinclude} ../lib/mlsys/summation.py
# :pyobject: running_sum
# ```
#
# ## Measurement: the accumulation experiment in every variant

# %%
VARIANTS = [  # (label, addend, n, addend dtype, accumulator dtype, explicit cast)
    ("fp32", ADDEND, N_TERMS, "fp32", "fp32", False),
    ("fp16", ADDEND, N_TERMS, "fp16", "fp16", False),
    ("fp32 acc += fp16 addend (implicit)", ADDEND, N_TERMS, "fp16", "fp32", False),
    ("fp32 acc += fp16 addend (explicit .float())", ADDEND, N_TERMS, "fp16", "fp32", True),
    ("bf16", ADDEND, N_TERMS, "bf16", "bf16", False),
    ("fp32 acc += bf16 addend", ADDEND, N_TERMS, "bf16", "fp32", False),
    ("fp32", SMALL_ADDEND, N_SMALL, "fp32", "fp32", False),
    ("fp16", SMALL_ADDEND, N_SMALL, "fp16", "fp16", False),
    ("bf16", SMALL_ADDEND, N_SMALL, "bf16", "bf16", False),
]
results, result_rows = [], []
for label, a, n, x_dt, acc_dt, explicit in VARIANTS:
    predicted = S.plateau_sum(a, n, acc_dt, addend_format=x_dt)  # no torch arithmetic involved
    measured = S.running_sum(a, n, x_dt, acc_dt, explicit_cast=explicit)
    assert measured.double().tolist() == predicted.trajectory()  # every partial sum, bit for bit
    final, intended = measured[-1].item(), n * a
    results.append((label, a, n, predicted, measured))
    stall = "-" if predicted.stall_step is None else f"{predicted.stall_step} (at {predicted.final:g})"
    result_rows.append([f"{a} x {n}", label, repr(predicted.addend), repr(predicted.final), repr(final),
                        f"{final - intended:+.3g}", stall])
Table(["sum", "variant", "addend as stored", "predicted", "measured", "measured - intended", "stops growing after"],
      result_rows)

# %% [markdown]
# Every measured partial sum, not just the last, equals the prediction bit for bit. The plot shows the
# trajectories: measured (solid), predicted (dashed, on top) and the predicted plateau $s^*$ (dotted).

# %%
FORMAT_COLORS = {"fp32": CYCLE[0], "fp16": CYCLE[2], "bf16": CYCLE[3]}  # CYCLE[1] is the prediction colour
fig, axes = subplots(1, 2, width=10.0, height=3.9)
for ax, (a, n) in zip(axes, [(ADDEND, N_TERMS), (SMALL_ADDEND, N_SMALL)], strict=True):
    ax.plot([0, n], [0, n * a], color=COLORS["muted"], lw=1, label="exact n·a")
    for fmt in ("fp32", "fp16", "bf16"):
        _, _, _, predicted, measured = next(r for r in results if r[0] == fmt and r[1] == a)
        steps = range(1, n + 1)
        color = FORMAT_COLORS[fmt]
        ax.plot(steps, measured.double().tolist(), color=color, lw=3, alpha=0.5, label=f"{fmt} measured")
        ax.plot(steps, predicted.trajectory(), color=COLORS["predicted"], lw=1, ls="--",
                label="predicted (plateau_sum)" if fmt == "bf16" else None)
        s_star = S.plateau_value(predicted.addend, fmt)
        if s_star <= n * a:
            ax.axhline(s_star, color=color, ls=":", lw=1.2, label=f"{fmt} plateau s*")
    finish(ax, title=f"{a} added {n:,} times", xlabel="additions", ylabel="running sum")
plt.show()

# %% [markdown]
# ## Why each result comes out as it does
#
# `plateau_sum` records the sum as segments: runs of additions that each add the same amount. Here they are
# for fp16 and bf16 with 0.01 (the single crossing steps between binades are left out):

# %%
by_key = {(r[0], r[1]): r for r in results}
pred_fp16, pred_bf16 = by_key[("fp16", ADDEND)][3], by_key[("bf16", ADDEND)][3]
header = ["from", "to", "ulp", "a / ulp", "ulps per step", "adds per step", "vs addend", "steps"]
for prediction in (pred_fp16, pred_bf16):
    a = prediction.addend
    display(Table(header, [[f"{seg.start:.6g}", f"{seg.end:.6g}", seg.ulp, f"{a / seg.ulp:.3g}",
                            f"{seg.increment / seg.ulp:g}", repr(seg.increment), f"{(seg.increment - a) / a:+.1%}",
                            seg.steps] for seg in prediction.segments if seg.steps > 1 or seg.increment == 0]))

# Numbers for the explanation below, all read off the predictions.
for tag, prediction, (lo, hi) in [("fp16_lo", pred_fp16, (4, 8)), ("fp16_hi", pred_fp16, (8, 16)),
                                  ("bf16_lo", pred_bf16, (2, 4))]:
    run = prediction.run_starting_in(lo, hi)
    glue(f"{tag}_ratio", prediction.addend / run.ulp)
    glue(f"{tag}_ulps", run.increment / run.ulp)
    glue(f"{tag}_step", run.increment)
    glue(f"{tag}_bias", abs(run.increment - prediction.addend) / prediction.addend)
glue("bf16_half_ulp_at_plateau", P.ulp(pred_bf16.final, "bf16") / 2)
assert pred_bf16.addend < P.ulp(pred_bf16.final, "bf16") / 2
glue("a_fp16", P.round_to(ADDEND, "fp16"))
glue("a_bf16", P.round_to(ADDEND, "bf16"))
glue("a_fp32_error", abs(P.round_to(ADDEND, "fp32") - ADDEND))
for key, name in [(("fp16", ADDEND), "final_fp16"), (("bf16", ADDEND), "final_bf16"),
                  (("fp32", ADDEND), "final_fp32"), (("fp32 acc += fp16 addend (implicit)", ADDEND), "final_acc16"),
                  (("fp32 acc += bf16 addend", ADDEND), "final_acc_bf16"),
                  (("fp32", SMALL_ADDEND), "final_fp32_small"), (("fp16", SMALL_ADDEND), "final_fp16_small"),
                  (("bf16", SMALL_ADDEND), "final_bf16_small")]:
    glue(name, by_key[key][4][-1].item())
glue("stall_bf16_run", pred_bf16.stall_step)
glue("stall_fp16_small", by_key[("fp16", SMALL_ADDEND)][3].stall_step)
glue("stall_bf16_small", by_key[("bf16", SMALL_ADDEND)][3].stall_step)
fp32_top = by_key[("fp32", ADDEND)][3].run_starting_in(8, 16)
glue("fp32_step_top", fp32_top.increment)
glue("fp32_step_error", abs(fp32_top.increment - P.round_to(ADDEND, "fp32")))
for label in ("fp32 acc += fp16 addend (implicit)", "fp32 acc += bf16 addend"):
    prediction = by_key[(label, ADDEND)][3]
    assert prediction.final == prediction.exact  # no rounding at all in the fp32 accumulator

# %% [markdown]
# Variant by variant:
#
# - **fp16, 0.01 × 1000.** 0.01 is stored as {glue:text}`a_fp16`. Between 4 and 8 the ulp is $2^{-8}$,
#   $a/u =$ {glue:text}`fp16_lo_ratio:.3g` rounds to {glue:text}`fp16_lo_ulps:.0f` ulps, so every step adds
#   {glue:text}`fp16_lo_step` ({glue:text}`fp16_lo_bias:.0%` too much); between 8 and 16 the ulp is $2^{-7}$,
#   $a/u =$ {glue:text}`fp16_hi_ratio:.3g` rounds to {glue:text}`fp16_hi_ulps:.0f` ulp and every step adds
#   {glue:text}`fp16_hi_step` ({glue:text}`fp16_hi_bias:.0%` too little). The sum never reaches its plateau
#   at {glue:text}`plateau_fp16:.0f`; it ends at {glue:text}`final_fp16` because the two biases nearly cancel.
# - **bf16, 0.01 × 1000.** 0.01 is stored as {glue:text}`a_bf16`. Between 2 and 4, $a/u =$
#   {glue:text}`bf16_lo_ratio:.3g` rounds to {glue:text}`bf16_lo_ulps:.0f` ulp, so each step adds
#   {glue:text}`bf16_lo_step` ({glue:text}`bf16_lo_bias:.0%` too much): the sum *overshoots* the exact line on
#   its way up. At {glue:text}`final_bf16` half an ulp is {glue:text}`bf16_half_ulp_at_plateau`, more than
#   the addend, so after {glue:text}`stall_bf16_run` additions the sum is frozen for the rest.
# - **fp32 accumulator, fp16 or bf16 addends.** Promotion (`acc += x`) and an explicit `.float()` give the
#   same fp32 additions. Every partial sum $k a$ is a multiple of $2^{-17}$ (fp16's 0.01) or $2^{-12}$
#   (bf16's) below 16, which fits in fp32's 24 significand bits: fp32 adds **exactly**. The sums are
#   {glue:text}`final_acc16` and {glue:text}`final_acc_bf16`, exactly 1000 times the stored addend; all of
#   the error is the addend's representation error, multiplied by 1000.
# - **fp32, 0.01 × 1000.** The stored addend is off by only {glue:text}`a_fp32_error:.1e`, but between 8 and
#   16 each step adds {glue:text}`fp32_step_top`, {glue:text}`fp32_step_error:.1e` too much, and it errs the
#   same way for hundreds of steps. Final: {glue:text}`final_fp32`.
# - **0.001 × 10 000.** fp32 ends at {glue:text}`final_fp32_small`; fp16 freezes at
#   {glue:text}`final_fp16_small` after {glue:text}`stall_fp16_small` additions; bf16 freezes at
#   {glue:text}`final_bf16_small` after {glue:text}`stall_bf16_small`. Both plateaus are $s^*$ from the formula.

# %% [markdown]
# ### The ranking that gets repeated, and the one that is measured
#
# Write-ups of this experiment that circulate widely rank bf16's error *between* fp16's and fp32's,
# reasoning from bf16's fp32-sized exponent. Range plays no part here: the plateau is set by mantissa bits.

# %%
errors = {fmt: abs(by_key[(fmt, ADDEND)][4][-1].item() - N_TERMS * ADDEND) for fmt in ("fp32", "fp16", "bf16")}
measured_order = sorted(errors, key=errors.get)
claimed_order = ["fp32", "bf16", "fp16"]
predicted_errors = {fmt: abs(by_key[(fmt, ADDEND)][3].final - N_TERMS * ADDEND) for fmt in errors}
assert measured_order == sorted(predicted_errors, key=predicted_errors.get) == ["fp32", "fp16", "bf16"]
glue("bf16_vs_fp16_error", errors["bf16"] / errors["fp16"])
Table(["rank (smallest error first)", "claimed", "measured", "measured |sum - 10|"],
      [[i + 1, c, m, f"{errors[m]:.3g}"] for i, (c, m) in enumerate(zip(claimed_order, measured_order, strict=True))])

# %% [markdown]
# bf16's error is {glue:text}`bf16_vs_fp16_error:.0f` times fp16's.
#
# ## Remedies
#
# ### Accumulate in fp32
#
# The variants above already show the first remedy: keep the *addends* in 16 bits if you must, but add them
# into an fp32 accumulator. The plateau moves from {glue:text}`plateau_bf16:.0f` to
# {glue:text}`plateau_fp32:,.0f`, and what is left is the addends' own representation error. This is what
# mixed-precision training does with fp32 master weights and loss scaling {cite}`micikevicius2018mixed`,
# and what `torch.sum` does internally on 16-bit tensors:

# %%
terms = torch.full((N_TERMS,), ADDEND, dtype=torch.float16)
torch_sum = terms.sum().item()
exact_sum = S.plateau_sum(ADDEND, N_TERMS, "fp32", addend_format="fp16").exact
assert torch_sum == P.round_to(exact_sum, "fp16")  # an fp32 (or wider) accumulator, rounded once at the end
glue("torch_sum_fp16", repr(torch_sum))
print(f"torch.sum of {N_TERMS} fp16 0.01s: {torch_sum!r}; a running fp16 sum: "
      f"{by_key[('fp16', ADDEND)][4][-1].item()!r}")

# %% [markdown]
# `torch.sum` returns {glue:text}`torch_sum_fp16` in fp16: the exact sum rounded once. A hand-written loop
# that keeps its running total in fp16 does not get this.
#
# ### Kahan summation
#
# When the accumulator itself must stay narrow, Kahan's compensated summation {cite}`kahan1965summation`
# recovers the rounding error of each addition and feeds it into the next one. Its error bound is
# $2u\sum|x_i|$ to first order, independent of $n$, against $(n-1)u\sum|x_i|$ for the plain loop
# {cite}`higham2002accuracy`.
#
# ```{literalinclude} ../lib/mlsys/summation.py
# :pyobject: kahan_sum
# ```

# %%
kahan_rows = []
for fmt in ("fp16", "bf16"):
    values = torch.full((N_TERMS,), ADDEND)
    kahan = S.kahan_sum(values, fmt).item()
    exact = S.plateau_sum(ADDEND, N_TERMS, "fp64", addend_format=fmt).exact
    naive = by_key[(fmt, ADDEND)][4][-1].item()
    assert abs(kahan - exact) <= 2 * P.FORMATS[fmt].unit_roundoff * exact < abs(naive - exact)
    glue(f"kahan_{fmt}", repr(kahan))
    kahan_rows.append([fmt, repr(exact), repr(naive), repr(kahan), f"{(kahan - exact) / P.ulp(exact, fmt):+.2f}"])
Table(["format", "exact sum of stored addends", "running sum", "Kahan sum", "Kahan error (ulps)"], kahan_rows)

# %% [markdown]
# In bf16 the Kahan sum is {glue:text}`kahan_bf16`: within one rounding of the exact sum of the stored
# addends, at four operations per term instead of one.
#
# ### Why matrix units accumulate in fp32
#
# A matrix multiplication is a batch of dot products, and a dot product of length $K$ is a running sum of $K$
# products. With positive products of mean $\bar p$, an fp16 accumulator stalls once the partial sum passes
# about $2^{11}\bar p$, whatever the inputs' format. Tensor cores therefore take fp16, bf16 or fp8 *inputs*,
# form the products exactly and add them into fp32 accumulators {cite}`micikevicius2018mixed`. Below,
# `DOT_ROWS` dot products of uniform $[0,1)$ fp16 vectors per length $K$, against a float64 reference:
# fp16 products summed in fp16, the same with Kahan, exact products summed in fp32, and `torch.matmul` on
# this machine. The dashed lines are Higham's bound $\gamma_{K-1} = (K-1)u/(1-(K-1)u)$ for the plain loop
# ($\gamma_K$ when every product is rounded to fp16 as well); it says nothing for fp16 once
# $K \ge 2^{11}$.

# %%
g = torch.Generator().manual_seed(SEED)
K_max = max(DOT_LENGTHS)
A = torch.rand(DOT_ROWS, K_max, generator=g).half()
b = torch.rand(K_max, generator=g).half()
dev = env.device()
curves = {"fp16 products, fp16 sum": [], "fp16, Kahan": [], "exact products, fp32 sum": [],
          f"torch.matmul fp16 ({dev})": []}
for K in DOT_LENGTHS:
    a_k, b_k = A[:, :K], b[:K]
    reference = a_k.double() @ b_k.double()  # exact: 22-bit products, sums well inside float64
    got = {"fp16 products, fp16 sum": S.sequential_sum(a_k * b_k, "fp16"),
           "fp16, Kahan": S.kahan_sum(a_k * b_k, "fp16"),
           "exact products, fp32 sum": S.sequential_sum(a_k.float() * b_k.float(), "fp32"),
           f"torch.matmul fp16 ({dev})": (a_k.to(dev) @ b_k.to(dev)).cpu()}
    for name, value in got.items():
        curves[name].append(((value.double() - reference).abs() / reference).max().item())
    # Higham's bounds hold: gamma_(K-1) for the fp32 sum of exact products, gamma_K when each product is
    # rounded to fp16 first (one more rounding per term).
    assert curves["exact products, fp32 sum"][-1] <= S.recursive_sum_error_bound(K, "fp32")
    assert curves["fp16 products, fp16 sum"][-1] <= S.recursive_sum_error_bound(K + 1, "fp16")
glue("dot_fp16_error", curves["fp16 products, fp16 sum"][-1])
glue("dot_fp32_error", curves["exact products, fp32 sum"][-1])
glue("dot_matmul_error", curves[f"torch.matmul fp16 ({dev})"][-1])
glue("dot_k_max", K_max)
one_rounding = curves[f"torch.matmul fp16 ({dev})"][-1] <= 2 * P.FORMATS["fp16"].unit_roundoff
glue("dot_matmul_verdict", "about one fp16 rounding of the result, the signature of a wide accumulator rounded "
     "once at the end" if one_rounding else "more than one fp16 rounding, so this backend accumulates at "
     "least partly in reduced precision")

fig, ax = subplots(width=7.0, height=4.0)
for color, (name, errs) in zip(CYCLE, curves.items(), strict=False):
    ax.plot(DOT_LENGTHS, errs, "o-", color=color, label=f"{name} (measured)")
for fmt, extra, color in [("fp16", 1, CYCLE[0]), ("fp32", 0, CYCLE[2])]:
    bounds = [S.recursive_sum_error_bound(K + extra, fmt) for K in DOT_LENGTHS]
    ax.plot([K for K, v in zip(DOT_LENGTHS, bounds, strict=True) if v < 1],
            [v for v in bounds if v < 1], "--", color=color,
            label=f"bound γ(K{'' if extra else '-1'}), {fmt} (predicted)")
ax.axhline(P.FORMATS["fp16"].unit_roundoff, color=COLORS["ceiling"], lw=0.8, ls=":",
           label="fp16 unit roundoff (one final rounding)")
finish(ax, title="Dot products of length K, fp16 inputs", xlabel="K", ylabel="max relative error", logx=2,
       logy=True)
ax.legend(fontsize=7)
plt.show()

# %% [markdown]
# At $K =$ {glue:text}`dot_k_max` the fp16 loop is off by {glue:text}`dot_fp16_error:.1%`, the fp32
# accumulator by {glue:text}`dot_fp32_error:.1e`, and `torch.matmul` by {glue:text}`dot_matmul_error:.1e`:
# {glue:text}`dot_matmul_verdict`.
#
# ```{admonition} Takeaway
# :class: tip
# A running sum stops growing once the addend is below half an ulp, at $s^* = 2^{\lfloor\log_2 a\rfloor+m+2}$:
# 1000 additions of 0.01 end at {glue:text}`final_bf16` in bf16 (frozen after {glue:text}`stall_bf16_run`
# steps), {glue:text}`final_fp16` in fp16 and {glue:text}`final_fp32` in fp32, each predicted bit for bit.
# Accumulating the same bf16 addends in fp32 gives {glue:text}`final_acc_bf16`: keep accumulators in fp32.
# ```
#
# ## Exercises
#
# ### Q1 [The plateau of 0.1 in bf16]
#
# Predict where a bf16 running sum of 0.1 stops growing, then measure it.
#
# ```{dropdown} Answer
# 0.1 is stored as {glue:text}`q1_stored`, $\lfloor \log_2 a \rfloor = -4$ and $m = 7$, so
# $s^* = 2^{-4+7+2} =$ {glue:text}`q1_plateau:.0f`: there half an ulp, {glue:text}`q1_half_ulp`, exceeds the
# addend. The cell below predicts with `plateau_value` and measures with `running_sum`.
# ```

# %% tags=["hide-input"]
predicted_q1 = S.plateau_value(P.round_to(0.1, "bf16"), "bf16")
measured_q1 = S.running_sum(0.1, 1000, "bf16")[-1].item()
assert measured_q1 == predicted_q1 == 2.0 ** (math.floor(math.log2(0.1)) + 7 + 2)
glue("q1_stored", P.round_to(0.1, "bf16"))
glue("q1_plateau", predicted_q1)
glue("q1_half_ulp", P.ulp(predicted_q1, "bf16") / 2)
print(f"predicted {predicted_q1}, measured {measured_q1}")

# %% [markdown]
# ### Q2 [Counting to a number fp16 cannot pass]
#
# Add 1.0 to an fp16 running sum. After how many additions does it stop growing, and at what value?
#
# ```{dropdown} Answer
# At $2^{11}$ the spacing becomes 2, so $2^{11} + 1$ is exactly halfway between $2^{11}$ and $2^{11} + 2$;
# ties go to the even mantissa, $2^{11}$. The sum counts {glue:text}`q2_steps` ones and then stays at
# $2^{0 + m + 1} =$ {glue:text}`q2_plateau:.0f` (the power-of-two case of the formula).
# ```

# %% tags=["hide-input"]
prediction_q2 = S.plateau_sum(1.0, 2100, "fp16")
measured_q2 = S.running_sum(1.0, 2100, "fp16")
first_at_plateau = int((measured_q2 == prediction_q2.final).nonzero()[0]) + 1  # additions to get there
assert first_at_plateau == prediction_q2.stall_step == 2**11 and measured_q2[-1].item() == 2.0**11
glue("q2_steps", prediction_q2.stall_step)
glue("q2_plateau", prediction_q2.final)
print(f"stops after {prediction_q2.stall_step} additions at {prediction_q2.final}")

# %% [markdown]
# ### Q3 [The largest fp16 number you can square]
#
# Which fp16 value is the largest whose square, computed in fp16, is finite? Derive it, then check it
# against all 65 536 fp16 bit patterns.
#
# ```{dropdown} Answer
# The square rounds to inf once it reaches $65504 + \text{ulp}(65504)/2 = 65520$, so
# $x < \sqrt{65520} \approx$ {glue:text}`q3_threshold:.5g`. fp16's spacing between 128 and 256 is $2^{-3}$, so
# the answer is $256 - 2^{-3} =$ {glue:text}`q3_answer`, whose square rounds to {glue:text}`q3_square`.
# ```

# %% tags=["hide-input"]
threshold = math.sqrt(fp16.max + P.ulp(fp16.max, fp16) / 2)
predicted_q3 = math.floor(threshold / P.ulp(threshold, fp16)) * P.ulp(threshold, fp16)
every_fp16 = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16)
finite_square = every_fp16[torch.isfinite(every_fp16 * every_fp16)]
measured_q3 = finite_square.max().item()
assert measured_q3 == predicted_q3 == 256 - 2**-3
glue("q3_threshold", threshold)
glue("q3_answer", predicted_q3)
glue("q3_square", P.round_to(predicted_q3**2, "fp16"))
print(f"predicted {predicted_q3}, measured {measured_q3}")

# %% [markdown]
# ### Q4 [Stochastic rounding removes the bias]
#
# Instead of rounding to nearest, round $s + a$ *down or up at random*, with probability proportional to
# closeness, so that $\mathbb{E}[\text{round}(x)] = x$ {cite}`gupta2015limited`. Sum 0.01 (kept exact, as an
# fp32 update would be) into a bf16 accumulator 1000 times with `stochastic_round`, over `SR_CHAINS`
# independent runs. Is the mean within statistical error of 10?
#
# ```{dropdown} Answer
# Yes. Each step is unbiased, so $\mathbb{E}[s_n] = n a = 10$; each rounding adds variance at most
# $u^2/4$ with $u \le 2^{-4}$ below 16, so one run has standard deviation at most $\sqrt{n}\,2^{-4}/2
# \approx$ {glue:text}`q4_sigma:.2f`. The mean of the runs is {glue:text}`q4_mean:.3f`, within four standard
# errors ({glue:text}`q4_tolerance:.2f`) of 10. Round-to-nearest gives {glue:text}`final_bf16` every time:
# stochastic rounding trades a systematic error for noise that averages out, which is why it is used for
# low-precision weight updates.
# ```

# %% tags=["hide-input"]
g = torch.Generator().manual_seed(SEED)
sums = torch.zeros(SR_CHAINS, dtype=torch.float64)
for _ in range(N_TERMS):
    sums = P.stochastic_round(sums + ADDEND, "bf16", generator=g)
sigma_bound = math.sqrt(N_TERMS) * P.ulp(15.9, "bf16") / 2  # per run, while the sum stays below 16
tolerance = 4 * sigma_bound / math.sqrt(SR_CHAINS)
mean = sums.mean().item()
assert abs(mean - N_TERMS * ADDEND) < tolerance < abs(by_key[("bf16", ADDEND)][4][-1].item() - N_TERMS * ADDEND)
assert sums.max().item() < 16 and sums.std().item() <= sigma_bound
glue("q4_sigma", sigma_bound)
glue("q4_mean", mean)
glue("q4_tolerance", tolerance)
print(f"mean of {SR_CHAINS} runs {mean:.3f} (tolerance ±{tolerance:.3f}), std {sums.std().item():.3f}")

# %% [markdown]
# ## Summary
#
# - A format is two numbers, exponent bits $e$ (range) and mantissa bits $m$ (precision), plus a convention
#   for inf/NaN; max, smallest normal and subnormal, and eps all follow, and match `torch.finfo`.
# - Spacing is $2^{E-m}$ inside each binade: relative precision $2^{-m}$, absolute spacing growing with
#   magnitude. fp16 underflows below $2^{-24}$ and overflows above {glue:text}`fp16_max:.0f`; bf16 has fp32's
#   range but {glue:text}`bf16_over_fp16_spacing:.0f` times coarser spacing than fp16.
# - A running sum adds $\text{round}(a/u)$ ulps per step and freezes at $s^* = 2^{\lfloor\log_2 a\rfloor+m+2}$;
#   `mlsys.precision.plateau_sum` predicts every partial sum, and the torch measurement matches bit for bit.
# - With 0.01 × 1000, bf16 is the worst format (frozen at {glue:text}`final_bf16`), not a middle ground:
#   range does not help a sum, precision does.
# - Remedies: fp32 accumulators (mixed precision, tensor cores, `torch.sum`), Kahan summation when the
#   accumulator must stay narrow, stochastic rounding when the bias is the problem.
