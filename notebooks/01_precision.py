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
# **Question.** Add {glue:text}`q_addend` to a running sum {glue:text}`q_terms:,` times in fp32,
# fp16 and bf16: which format lands farthest from {glue:text}`q_target`, by how much, and can we
# predict every digit of the answer before running it? And what does the same rounding do to a dot
# product of {glue:text}`q_length:,` terms, the inner loop of every matrix multiply?
#
# Cheat sheet: {doc}`../book/memory_onepager`.

# %% tags=["remove-cell"]
# Colab or a fresh kernel: install the book's library if it is missing (a no-op in the book's own
# environment). Offline, install it from a clone instead: `pip install -e .` at the clone's root.
import importlib
import importlib.util
import subprocess
import sys

MLSYS_SOURCE = "git+https://github.com/mlsys-book/mlsys-book"
if importlib.util.find_spec("mlsys") is None:
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", MLSYS_SOURCE],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        raise RuntimeError(
            f"This chapter needs the book's library `mlsys`, and `pip install {MLSYS_SOURCE}` "
            f"failed (offline?):\n{pip.stderr.strip()[-800:]}\nInstall it from a clone of the "
            "repository (`pip install -e .` at its root), then restart the kernel.")
    importlib.invalidate_caches()

# %% tags=["remove-input"]
from mlsys import env

print(env.describe())

# %% tags=["remove-cell"]
import itertools
import math

import matplotlib.pyplot as plt
import torch
from IPython.display import display

from mlsys import experiments
from mlsys.book import Table, glue, num, solved_by
from mlsys.diagrams import formats
from mlsys.experiments import dot_accumulation as DA
from mlsys.experiments import kit, pages, running_sums
from mlsys.numerics import bit_fields, precision, summation

# %% tags=["parameters"]
SEED = 0
ADDEND, N_TERMS = 0.01, 1000  # the experiment everyone quotes
SMALL_ADDEND, N_SMALL = 0.001, 10_000  # its smaller-step cousin
DOT = DA.EXPERIMENT.sizes_for()  # dot products: lengths K, rows x cols of them (by profile)
WEIGHT, UPDATE = 1.0, 1e-3  # a weight and one optimizer update to it
GRADIENT, LOSS_SCALE = 1e-8, 2.0**16  # a small gradient, and fp16's usual initial loss scale
WIDTH = 4096  # d_model of the activation row in Q1
LARGE_X = 300.0  # Q1 (a): an activation too large to square in fp16?
NORM_EPS = 1e-5  # the epsilon of a normalization layer (Q2)
BIT_CASES = [1.0, -2.5, 0.1, 1e-6, 3e4]  # Q3: numbers whose stored bits the reader extracts
TOKENS_PER_STEP, COUNTER_STEPS = 4096, 300  # Q4: a token counter, and the steps measured
SR_TRIALS = 256  # independent stochastic-rounding runs of each sum
FP8, SCALE_N, SCALE_STD, SCALE_OUTLIERS = "fp8_e4m3", 4096, 1e-3, 4  # a tensor with 4 outliers
SCALE_RATIOS = (1, 1e2, 1e4, 1e6)  # the outliers' size, in standard deviations of the rest

# %% tags=["remove-cell"]
for name, value in [("q_addend", ADDEND), ("q_terms", N_TERMS), ("q_target", N_TERMS * ADDEND),
                    ("q_small", SMALL_ADDEND), ("q_small_terms", N_SMALL),
                    ("q_length", DOT.lengths[-1]), ("q1_large", LARGE_X)]:
    glue(name, value)

# %% [markdown]
# ## Seven formats from two numbers
#
# A binary floating-point number is a sign, an exponent field $E$ of $e$ bits and a mantissa field
# $M$ of $m$ bits. A normal number is $(-1)^S \, 2^{E-\text{bias}} \, (1 + M/2^m)$ with
# $\text{bias} = 2^{e-1}-1$; when $E=0$ the leading 1 is dropped and the number is *subnormal*,
# $2^{1-\text{bias}}\,(M/2^m)$. The diagram draws every format of the book this way, one box per
# bit, the widths read from the format's $(e, m)$, the rows aligned on the binary point: what a
# format spends on range lies left of the dashed line, what it spends on precision right of it.
# Under each row are the limits that follow from $(e, m)$.

# %% tags=["hide-input"]
formats.draw_bit_fields()  # every format of mlsys.numerics.precision.FORMATS
plt.show()

# %% [markdown]
# Read down the dashed line: bf16 and tf32 keep fp32's exponent field, so their range is fp32's,
# and cut the mantissa; fp16 keeps more mantissa than bf16 and pays with range. IEEE 754
# {cite}`ieee754_2019` reserves the all-ones exponent for infinities and NaN. The fp8 format e4m3
# {cite}`micikevicius2022fp8` ("fn": finite) gives that exponent back to finite numbers except for
# one mantissa pattern: $S.1111.111$ is NaN, with either sign, so e4m3 has two NaN encodings, no
# infinity, and its largest value is $1.75 \cdot 2^8$. tf32
# is not a storage type: it is what NVIDIA tensor cores read from an fp32 operand, fp32's 8 exponent
# bits with fp16's 10 mantissa bits {cite}`nvidia_a100_datasheet`. `FloatFormat` derives every
# column of the table below from $(e, m)$ and that convention; the cell checks them against
# `torch.finfo`, and counts the special values by decoding every bit pattern of the formats of 16
# bits or fewer: an IEEE format has 2 infinities and $2(2^m-1)$ NaNs, e4m3fn none and 2.
#
# ```{literalinclude} ../lib/mlsys/numerics/precision.py
# :pyobject: FloatFormat
# ```

# %% tags=["hide-input"]
table_rows = running_sums.format_rows()  # asserts each limit against torch.finfo, and the special
# values against every bit pattern of the formats of 16 bits or fewer, decoded by torch
fp16, bf16, fp32 = precision.FORMATS["fp16"], precision.FORMATS["bf16"], precision.FORMATS["fp32"]
for name, value in [("fp16_max", fp16.max), ("fp16_subnormal", fp16.smallest_subnormal),
                    ("bf16_subnormal", bf16.smallest_subnormal)]:
    glue(name, value)
Table(["format", "bias", "max", "smallest normal", "smallest subnormal", "eps", "inf, NaN",
       "torch dtype"], table_rows)

# %% [markdown]
# Range comes from the exponent bits, precision from the mantissa bits. bf16 keeps fp32's range (8
# exponent bits) and pays with precision: its eps, the gap after 1, is $2^{-7}$ against fp16's
# $2^{-10}$. That trade decides the accumulation experiment below.
#
# ### The bits of a few numbers
#
# `decompose` rounds a number to a format and splits the stored value into its fields; the cell
# checks each pattern against the bits torch stores. e4m3 saturates: a number past its largest
# becomes the largest, as torch 2.13's cast does (torch 2.11's gives NaN; `saturating_cast`
# clamps first there).

# %% tags=["hide-input"]
bit_rows = running_sums.bit_rows([1.0, 0.1, -2.5, 0.01, 65504.0, 1e-8],  # each against torch's bits
                                 ["fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"])
glue("e4m3_max", precision.FORMATS["fp8_e4m3"].max)
glue("fp16_max_in_bf16", precision.round_to(fp16.max, "bf16"))
Table(["x", "format", "sign exponent mantissa", "kind", "E - bias", "stored value"], bit_rows)

# %% [markdown]
# Three things to read off: 0.1 is stored as 0.1 in no binary format (its mantissa is a repeating
# pattern cut off after $m$ bits); {glue:text}`fp16_max:.0f` is fp16's largest number, which e4m3
# saturates to {glue:text}`e4m3_max:.0f` and bf16 rounds to {glue:text}`fp16_max_in_bf16:.0f`;
# $10^{-8}$ is below fp16's smallest subnormal and becomes 0, while bf16 stores it.
#
# ### Spacing grows with magnitude
#
# Between $2^E$ and $2^{E+1}$ the numbers of a format are evenly spaced by $\text{ulp} = 2^{E-m}$
# (unit in the last place); below the smallest normal the spacing stays at the subnormal step. The
# relative spacing is therefore between $2^{-m-1}$ and $2^{-m}$ in the normal range. `ulp` computes
# it; the markers are measured as the gap from a torch value to the next bit pattern.

# %% tags=["hide-input"]
formats.draw_spacing(measured=("fp32", "fp16", "bf16"))  # ulp(x), and torch's gaps measured
plt.show()
spacing_ratio = glue("bf16_over_fp16_spacing",
                     precision.ulp(1.0, "bf16") / precision.ulp(1.0, "fp16"))
assert spacing_ratio == 2 ** (fp16.mantissa_bits - bf16.mantissa_bits)

# %% [markdown]
# fp16 and tf32 share one staircase (10 mantissa bits) until fp16 runs out of exponent; bf16's
# staircase sits {glue:text}`bf16_over_fp16_spacing:.0f` times higher than fp16's wherever both are
# normal.
#
# ### Underflow, overflow and rounding to nearest even

# %%
tiny = torch.tensor(1e-8)
underflow = {"fp16": tiny.half().item(), "bf16": tiny.bfloat16().item()}
assert underflow["fp16"] == 0.0 and underflow["bf16"] == precision.round_to(1e-8, "bf16") != 0.0
x = torch.tensor([200.0, 255.0, 255.875, 256.0, 300.0], dtype=torch.float16)
squares = (x * x).tolist()
overflow_threshold = math.sqrt(fp16.max + precision.ulp(fp16.max, "fp16") / 2)  # x*x inf above
assert [math.isinf(s) for s in squares] == [v > overflow_threshold for v in x.tolist()]
glue("sqrt_fp16_max", overflow_threshold)
ties = torch.tensor([2049.0, 2050.0, 2051.0, 2053.0], dtype=torch.float32)
rounded = ties.half().tolist()
assert rounded == [precision.round_to(v, "fp16") for v in ties.tolist()]
assert rounded == [2048.0, 2050.0, 2052.0, 2052.0]
print(f"1e-8 stored: {underflow}", f"fp16 x*x: {squares}", f"ties above 2048: {rounded}", sep="\n")

# %% [markdown]
# fp16 stores nothing below {glue:text}`fp16_subnormal:.3g`, so $10^{-8}$ underflows to zero (bf16
# goes down to {glue:text}`bf16_subnormal:.1e`). Its largest number is {glue:text}`fp16_max:.0f`, so
# a square overflows to `inf` once $x >$ {glue:text}`sqrt_fp16_max:.5g` (the square must stay below
# $65504 + \text{ulp}/2 = 65520$, the tie that rounds up to $2^{16}$). Between 2048 and 4096 the
# spacing is 2: 2049 and 2051 are exactly halfway, and *round to nearest, ties to even* sends them
# to the neighbour whose last mantissa bit is 0 (2048 and 2052). `round_to` does this with exact
# rational arithmetic and agrees with torch's casts bit for bit (the tests check every tie of both
# fp8 formats and thousands of fp16 and bf16 ties).
#
# ## Napkin math: where a running sum stops
#
# Take a running sum $s \leftarrow \text{round}(s + a)$. Inside a binade $[2^E, 2^{E+1})$ the sum is
# a whole number $k$ of ulps $u = 2^{E-m}$, so each addition adds exactly $\text{round}(a/u)$ ulps:
# the same amount every step, which is usually *not* $a$. Once $a < u/2$ that is zero ulps and the
# sum never moves again. The first binade where this happens starts at
#
# $$ s^* = 2^{\lfloor \log_2 a \rfloor + m + 2}, $$
#
# and the sum arrives there exactly: in the binade below, $a \ge u/2$ still, and the step that
# crosses $s^*$ rounds onto it. (For $a = 2^p$ the tie rule stops the sum one binade earlier, at
# $2^{p+m+1}$.) The plateau depends on the mantissa bits only, not on the range: bf16 has fp32's
# range and 3 fewer mantissa bits than fp16, so it freezes {glue:text}`bf16_over_fp16_spacing:.0f`
# times lower. `plateau_value` is this formula; `plateau_sum` walks the binades one by one and
# predicts every partial sum exactly.

# %% tags=["hide-input"]
napkin_rows = []
for name, f in precision.FORMATS.items():
    stored = precision.round_to(ADDEND, f)
    s_star = summation.plateau_value(stored, f)
    walk = summation.plateau_sum(ADDEND, 10**18, f)  # a binade walk: cheap even for 10^18 additions
    assert walk.final == s_star and walk.stall_step is not None
    napkin_rows.append([name, repr(stored), num(precision.ulp(s_star, f), 6), num(s_star, 6),
                        f"{walk.stall_step:,}"])
    glue(f"plateau_{name}", s_star)
    glue(f"stall_{name}", walk.stall_step)
Table(["format", f"{ADDEND} stored as", "ulp at plateau", "plateau s*", "additions that count"],
      napkin_rows)

# %% [markdown]
# The ulp at the plateau is the same in every format: the sum freezes where the spacing first
# exceeds twice the addend, and only the magnitude at which that happens depends on $m$. So with
# {glue:text}`q_terms:,` additions of {glue:text}`q_addend`, the prediction before measuring
# anything is: fp32 and fp16 never reach their plateaus ({glue:text}`plateau_fp32:,.0f` and
# {glue:text}`plateau_fp16:.0f`), bf16 freezes at {glue:text}`plateau_bf16:.0f` after
# {glue:text}`stall_bf16` additions. The remaining error of fp32 and fp16 comes from each step
# adding $\text{round}(a/u)\,u$ instead of $a$.
#
# ## The code
#
# ```{literalinclude} ../lib/mlsys/numerics/summation.py
# :pyobject: plateau_value
# ```
#
# ```{literalinclude} ../lib/mlsys/numerics/summation.py
# :pyobject: plateau_sum
# ```
#
# The measurement is deliberately plain: one torch addition per step on a 0-d tensor, the addend
# stored by torch's own cast. `explicit_cast=True` writes `acc += x.to(acc.dtype)` instead of
# relying on type promotion in `acc += x`.
#
# ```{literalinclude} ../lib/mlsys/numerics/summation.py
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
# (label, addend) -> (prediction, measured final sum, every partial sum): `running_sum` adds with
# torch, `plateau_sum` predicts without torch arithmetic, and the two agree bit for bit
by_key = running_sums.run(VARIANTS)
running_sums.table(by_key)

# %% [markdown]
# Every measured partial sum, not just the last, equals the prediction bit for bit. The plot shows
# the trajectories: measured (solid), predicted (dashed, on top) and the predicted plateau $s^*$
# (dotted).

# %% tags=["remove-input"]
kit.draw(running_sums.plot, by_key, ncols=2, width=10.0, height=3.9,
         cases=[(ADDEND, N_TERMS), (SMALL_ADDEND, N_SMALL)])

# %% [markdown]
# ## Why each result comes out as it does
#
# `plateau_sum` records the sum as segments, runs of additions that each add the same amount; the
# numbers below are read off them.

# %% tags=["remove-cell"]
why = running_sums.readings(by_key, ADDEND, SMALL_ADDEND)  # the runs of equal additions, ...
assert why["a_bf16"] < why["bf16_half_ulp_at_plateau"]  # below half an ulp: frozen
for label in ("fp32 acc += fp16 addend (implicit)", "fp32 acc += bf16 addend"):
    assert by_key[(label, ADDEND)][0].final == by_key[(label, ADDEND)][0].exact  # exact fp32 sums
for name, value in why.items():
    glue(name, value)

# %% [markdown]
# - **fp16.** {glue:text}`q_addend` is stored as {glue:text}`a_fp16`. Between 4 and 8 every step
#   adds {glue:text}`fp16_lo_step` ({glue:text}`fp16_lo_bias:+.0%`); between 8 and 16 the ulp
#   doubles and every step adds {glue:text}`fp16_hi_step` ({glue:text}`fp16_hi_bias:+.0%`). The sum
#   never reaches its plateau at {glue:text}`plateau_fp16:.0f`; it ends at {glue:text}`final_fp16`
#   because the two biases nearly cancel.
# - **bf16.** {glue:text}`q_addend` is stored as {glue:text}`a_bf16`. Between 2 and 4 each step adds
#   {glue:text}`bf16_lo_step` ({glue:text}`bf16_lo_bias:+.0%`): the sum *overshoots* the exact line
#   on its way up. At {glue:text}`final_bf16` half an ulp is {glue:text}`bf16_half_ulp_at_plateau`,
#   more than the addend, so after {glue:text}`stall_bf16_run` additions the sum is frozen for good.
# - **fp32 accumulator, 16-bit addends.** Promotion and `.float()` give the same additions, all
#   **exact** in fp32: the error is the stored addend's, times {glue:text}`q_terms:,`.
# - **{glue:text}`q_small` × {glue:text}`q_small_terms:,`.** fp16 and bf16 freeze at their plateaus
#   $s^*$, {glue:text}`final_fp16_small` and {glue:text}`final_bf16_small`.
#
# ### The ranking that gets repeated, and the one that is measured
#
# Write-ups of this experiment that circulate widely rank bf16's error *between* fp16's and fp32's,
# reasoning from bf16's fp32-sized exponent. Range plays no part here: the plateau is set by
# mantissa bits.

# %% tags=["hide-input"]
errors = {fmt: abs(by_key[(fmt, ADDEND)][1] - N_TERMS * ADDEND) for fmt in ("fp32", "fp16", "bf16")}
predicted_errors = {fmt: abs(by_key[(fmt, ADDEND)][0].final - N_TERMS * ADDEND) for fmt in errors}
measured_order = sorted(errors, key=errors.get)
assert measured_order == sorted(predicted_errors, key=predicted_errors.get)
assert measured_order == ["fp32", "fp16", "bf16"]
glue("bf16_vs_fp16_error", errors["bf16"] / errors["fp16"])
Table(["rank (smallest error first)", "claimed", "measured", "measured |sum - 10|"],
      [[i + 1, c, m, f"{errors[m]:.3g}"]
       for i, (c, m) in enumerate(zip(["fp32", "bf16", "fp16"], measured_order, strict=True))])

# %% [markdown]
# bf16's error is {glue:text}`bf16_vs_fp16_error:.0f` times fp16's.
#
# ## Remedies
#
# **Accumulate in fp32.** The variants above show it: keep the *addends* in 16 bits if you must, but
# add them into an fp32 accumulator; what is left is the addends' own representation error.
# `torch.sum` does this internally on 16-bit tensors: it returns {glue:text}`torch_sum_fp16` in
# fp16, the exact sum rounded once, which a loop that keeps its total in fp16 does not get.
#
# **Kahan summation.** When the accumulator itself must stay narrow, Kahan's compensated summation
# {cite}`kahan1965summation` recovers the rounding error of each addition and feeds it into the
# next. Its error bound is $2u\sum|x_i|$ to first order, independent of $n$, against
# $(n-1)u\sum|x_i|$ for the plain loop {cite}`higham2002accuracy`.
#
# ```{literalinclude} ../lib/mlsys/numerics/summation.py
# :pyobject: kahan_sum
# ```

# %% tags=["hide-input"]
torch_sum = torch.full((N_TERMS,), ADDEND, dtype=torch.float16).sum().item()
exact_sum = summation.plateau_sum(ADDEND, N_TERMS, "fp32", addend_format="fp16").exact
assert torch_sum == precision.round_to(exact_sum, "fp16")  # a wide accumulator, rounded once
glue("torch_sum_fp16", repr(torch_sum))
kahan_rows = []
for fmt in ("fp16", "bf16"):
    kahan = summation.kahan_sum(torch.full((N_TERMS,), ADDEND), fmt).item()
    exact = summation.plateau_sum(ADDEND, N_TERMS, "fp64", addend_format=fmt).exact
    naive = by_key[(fmt, ADDEND)][1]
    u = precision.FORMATS[fmt].unit_roundoff
    assert abs(kahan - exact) <= 2 * u * exact < abs(naive - exact)
    kahan_rows.append([fmt, repr(exact), repr(naive), glue(f"kahan_{fmt}", repr(kahan))])
Table(["format", "exact sum of stored addends", "running sum", "Kahan sum"], kahan_rows)

# %% [markdown]
# In bf16 the Kahan sum is {glue:text}`kahan_bf16`: within one rounding of the exact sum of the
# stored addends, at four operations per term instead of one.
#
# **Stochastic rounding.** A third remedy attacks the bias itself. Round to nearest makes the same
# choice every time the same $s + a$ comes up, so its errors add up: below half an ulp it rounds
# every addition away. *Stochastic rounding* rounds $s + a$ up to the next number of the format
# with probability $(s + a - \text{down})/\text{ulp}$ and down otherwise
# {cite}`gupta2015limited`, so that $E[\text{round}(s + a)] = s + a$ exactly: the expected sum
# after $n$ additions is $n a$, with no plateau. The price is noise: each rounding error has mean 0
# and variance at most $\text{ulp}^2/4$, so one run lands within about $\sqrt{n}$ half-ulps of the
# exact sum. `stochastic_sum` runs {glue:text}`sr_trials` independent bf16 sums at once, one
# `stochastic_round` per addition, next to the same sum rounded to nearest by torch; the second
# case is a weight of {glue:text}`w_start:g` receiving {glue:text}`q_terms:,` updates of
# {glue:text}`w_update`, each below half its ulp (the next section).
#
# ```{literalinclude} ../lib/mlsys/numerics/stochastic.py
# :pyobject: stochastic_sum
# ```

# %%
SR_CASES = [(f"{ADDEND} x {N_TERMS:,}", ADDEND, N_TERMS, 0.0),  # (label, addend, n, start)
            (f"{WEIGHT:g} + {UPDATE} x {N_TERMS:,}", UPDATE, N_TERMS, WEIGHT)]
sr_table, sr = running_sums.stochastic_table(SR_CASES, "bf16", trials=SR_TRIALS, seed=SEED)
sr_table

# %% tags=["remove-cell"]
glue("sr_trials", SR_TRIALS)
glue("w_start", WEIGHT)
for (label, *_), key in zip(SR_CASES, ("sum", "weight"), strict=True):
    sums, nearest = sr[label]
    assert sums.std <= sums.std_bound  # the sqrt(n) law of a sum of independent roundings
    glue(f"sr_verdict_{key}", running_sums.stochastic_verdict(sums, nearest))

# %% [markdown]
# The sum of {glue:text}`q_addend`: {glue:text}`sr_verdict_sum`. The weight:
# {glue:text}`sr_verdict_weight`. Stochastic rounding keeps the expectation, not each run: one
# sum is off by its spread, which a training run averages over many weights and steps. It needs
# no extra bytes, only a random number per rounding: a bf16 weight updated this way needs no fp32
# master copy (chapter {ref}`sec-mixed-precision` trains the book's model so, beside the master
# copy and Kahan's compensation). What it removes is the accumulation's bias, not the addend's own
# representation error: the expected sum is $n$ times the addend *as stored*.
#
# ### Two different problems: accumulation and range
#
# Mixed-precision training {cite}`micikevicius2018mixed` has two remedies, often named together, for
# two problems. **fp32 master weights** fix accumulation: a weight is a running sum of its updates,
# and an update below half an ulp of the weight is lost. **Loss scaling** fixes range: an fp16
# gradient below the smallest subnormal is zero however it is summed; scaling the loss moves every
# gradient into range, and the fp32 update divides the scale out.

# %%
w_bf16 = (torch.tensor(WEIGHT, dtype=torch.bfloat16) + UPDATE).item()
w_fp32 = (torch.tensor(WEIGHT) + UPDATE).item()
assert w_bf16 == WEIGHT != w_fp32 and UPDATE < precision.ulp(WEIGHT, "bf16") / 2  # lost update
g_fp16 = torch.tensor(GRADIENT).half().item()
g_scaled = (torch.tensor(GRADIENT * LOSS_SCALE).half().double() / LOSS_SCALE).item()
g_bf16 = torch.tensor(GRADIENT).bfloat16().item()
assert g_fp16 == 0 and abs(g_scaled - GRADIENT) <= fp16.unit_roundoff * GRADIENT and g_bf16 != 0
for name, value in [("w_update", UPDATE), ("w_bf16_half_ulp", precision.ulp(WEIGHT, "bf16") / 2),
                    ("w_fp32", w_fp32), ("g_small", GRADIENT), ("g_scale", LOSS_SCALE),
                    ("g_scaled", g_scaled)]:
    glue(name, value)

# %% [markdown]
# An update of {glue:text}`w_update` to a bf16 weight of 1 is lost (half an ulp there is
# {glue:text}`w_bf16_half_ulp`); the fp32 master copy becomes {glue:text}`w_fp32`. A gradient of
# {glue:text}`g_small` is zero in fp16; scaled by {glue:text}`g_scale:.0f` it survives as
# {glue:text}`g_scaled`. bf16 has fp32's range: it needs no loss scaling, but still needs fp32
# master weights. Neither remedy helps a narrow accumulator inside a matrix multiply, the next
# section.
#
# ## Dot products, and what matrix units accumulate in
#
# A matrix multiply is a batch of dot products, and a dot product of length $K$ is a running sum of
# $K$ products. Two predictions for uniform $[0,1)$ inputs, before measuring. The plateau: a running
# sum of terms no larger than 1 can never pass $s^*(1) = 2^{m+1}$ ({glue:text}`ceiling_fp16:,.0f` in
# fp16), while the exact value grows as $K/4$. Higham's bound {cite}`higham2002accuracy` on the
# relative error of the plain loop, $\gamma_{K-1} = (K-1)u/(1-(K-1)u)$, grows linearly, and once it
# reaches 1 it says nothing at all: for fp16 that happens from $K =$ {glue:text}`vacuous_fp16:,`
# (bf16: {glue:text}`vacuous_bf16:,`, fp32: {glue:text}`vacuous_fp32:,`).

# %% tags=["hide-input"]
vacuous_rows = []
for fmt in ("fp16", "bf16", "fp32"):
    k = int(1 / (2 * precision.FORMATS[fmt].unit_roundoff)) + 1  # (K-1) u = 1/2: gamma_(K-1) = 1
    bound = [DA.higham_bound(j, fmt, rounded_products=False) for j in (k - 1, k)]
    assert bound[0] < 1 <= bound[1]
    vacuous_rows.append([fmt, f"{precision.FORMATS[fmt].unit_roundoff:.3g}",
                         f"{glue(f'vacuous_{fmt}', k):,}"])
assert k == 2**23 + 1 and summation.plateau_value(1.0, "fp16") == 2**11
glue("ceiling_fp16", summation.plateau_value(1.0, "fp16"))
glue("ceiling_k", 4 * summation.plateau_value(1.0, "fp16"))
Table(["accumulator", "unit roundoff u", "γ_(K-1) ≥ 1 (vacuous) from K ="], vacuous_rows)

# %% [markdown]
# Past $K \approx$ {glue:text}`ceiling_k:,.0f` the fp16 loop must therefore fall behind. The
# `dot_accumulation` experiment measures it: for each $K$, {glue:text}`dot_count:,` dot products of
# uniform inputs, each compared with its exact value. The exact value needs no wide floats: every
# fp16 or fp8 value in $[0, 1]$ is a whole multiple of $2^{-24}$, so integer arithmetic is exact.
#
# ```{literalinclude} ../lib/mlsys/experiments/dot_accumulation.py
# :pyobject: _exact
# ```
#
# The loops run on the CPU with `mlsys.numerics.summation` (fp16 products in an fp16 running sum,
# the same with Kahan, exact products in fp32); the matrix multiplies run on this machine's device:
# `torch.matmul` on fp16 inputs, and `torch._scaled_mm` on fp8 e4m3 inputs with an fp32 output.

# %%
dot_rows = DA.EXPERIMENT.run(DOT)  # every K: the loops on the CPU, the matmuls on this device

# %% tags=["hide-input"]
display(DA.table(dot_rows))
for k, err in DA.curves(dot_rows)["exact products, fp32 sum"]:
    assert err <= DA.higham_bound(k, "fp32", rounded_products=False)  # the law holds
for name, value in DA.headline(dot_rows).items():  # the errors at the largest K
    glue(name, value)
kit.draw(DA.plot, dot_rows, width=9.0, height=4.0,
         title=f"Dot products of length K: {DA.describe(dot_rows)}")

# %% [markdown]
# At $K =$ {glue:text}`dot_k_max:,` the fp16 loop is off by up to {glue:text}`dot_fp16_error:.1%`,
# Kahan's fp16 loop by {glue:text}`dot_kahan_error:.1e` ({glue:text}`dot_kahan_u:.2f` times fp16's
# unit roundoff) and the fp32 loop by {glue:text}`dot_fp32_error:.1e`. This machine's matrix
# multiplies: {glue:text}`dot_device_verdicts`.
#
# **What tensor cores do.** NVIDIA's matrix units take fp16 or bf16 inputs, form the products
# exactly and add them into fp32 accumulators {cite}`micikevicius2018mixed`, but the additions are
# not IEEE fp32 additions. Fasi et al. probed the V100, T4 and A100 tensor cores
# {cite}`fasi2021tensorcores`: a group of products and the accumulator are added in one step, the
# significands aligned to the largest exponent, the bits shifted out of the fp32 word truncated
# (rounding toward zero, not to nearest) and the sum normalized only at the end. So a tensor-core
# dot product with an "fp32 accumulator" is close to the fp32 loop above, not identical to it, and
# its rounding errors are one-sided (toward zero) instead of averaging out. fp8 on Hopper is
# different, and the difference is not in NVIDIA's documentation: cuBLAS only says that its fp8
# "fast accumulation" mode is faster and less accurate because "intermediate results will not
# periodically be promoted to a higher precision" ([cuBLAS,
# `CUBLASLT_MATMUL_DESC_FAST_ACCUM`](https://docs.nvidia.com/cuda/cublas/); PyTorch exposes it as
# `_scaled_mm(..., use_fast_accum=True)`). The DeepSeek-V3 report measured it
# ([§3.3.2](https://arxiv.org/abs/2412.19437)): on H800 the fp8 tensor-core accumulation keeps
# about 14 bits, not fp32's 24, and a $K = 4096$ GEMM of random matrices had a maximum relative
# error near 2%; DeepSeek therefore copies the partial sums to fp32 registers on the CUDA cores
# every 128 elements of $K$. That is an accumulation problem, like the fp16 loop above; loss scaling
# (range) would not touch it. A GPU run of this experiment measures both fp8 modes.

# %% tags=["hide-input"]
experiments.show_recorded("dot_accumulation", show=pages.show_dot_accumulation, would_show=(
    "On a CUDA GPU the run adds `torch.mm` with an fp32 output (the fp16 tensor-core accumulator, "
    "unrounded) and, from compute capability 8.9, `_scaled_mm` with fast accumulation."))

# %% [markdown]
# ### fp8 needs a scale: one per tensor, or one per block
#
# The fp8 matmuls above were handed inputs in range. A real tensor is not: e4m3 holds normal
# numbers from {glue:text}`fp8_min_normal:.3g` to {glue:text}`e4m3_max:.0f` and nothing below
# {glue:text}`fp8_min_sub:.2g`, a span of {glue:text}`fp8_octaves:.0f` octaves, while gradients
# of $10^{-4}$ or an activation with outlier channels live elsewhere. So every fp8 recipe
# multiplies a tensor by a scale $s$ before the cast and divides it out after. **Per tensor**,
# $s = \text{max}/\text{amax}$ puts the largest entry on the format's largest number
# {cite}`micikevicius2022fp8` (`mlsys.numerics.fp8`, chapter {ref}`sec-mixed-precision`); one
# outlier then sets the scale for everything, and an outlier $r$ times the typical entry pushes the
# typical entries $r$ times below max, into the subnormals and out. **Per block**, the OCP
# Microscaling formats store one power-of-two scale (an 8-bit exponent) per block of
# {glue:text}`mx_block` consecutive elements {cite}`rouhani2023microscaling`: MXFP8 is e4m3 or
# e5m2 elements under such a scale, and an outlier costs only its own block. The table casts
# {glue:text}`scale_n:,` normal entries of standard deviation {glue:text}`scale_std:g`, with
# {glue:text}`scale_outliers` outliers among them, to e4m3 in each way: the mean relative error of
# the entries (and the share flushed to zero).

# %% tags=["hide-input"]
mx_table, mx = running_sums.scaling_table(FP8, SCALE_RATIOS, n=SCALE_N, std=SCALE_STD,
                                          outliers=SCALE_OUTLIERS, seed=SEED)
big, small = SCALE_RATIOS[-1], SCALE_RATIOS[0]
assert mx[(small, "none")].flushed > 0.5 > mx[(small, "tensor")].flushed  # the bulk needs a scale
assert mx[(big, "tensor")].mean_relative > 10 * mx[(big, "block")].mean_relative  # outliers' cost
for name, value in [*running_sums.scaling_readings(mx, FP8).items(), ("scale_n", SCALE_N),
                    ("scale_outliers", SCALE_OUTLIERS), ("scale_std", SCALE_STD)]:  # for the text
    glue(name, value)
mx_table

# %% [markdown]
# Without a scale {glue:text}`none_flushed:.0%` of the entries become zero: they are below e4m3's
# range, whatever its precision. One scale per tensor fixes that while the outliers are mild (an
# error of {glue:text}`clean_err:.1%`, e4m3's rounding, without them); with outliers at
# {glue:text}`big_ratio:,.0f` times the rest it loses {glue:text}`tensor_flushed:.0%` of the
# entries and errs by {glue:text}`tensor_err:.0%` on average. One scale per block of
# {glue:text}`mx_block` keeps the error at {glue:text}`block_err:.1%`: only the entries that share
# a block with an outlier suffer. The cost is a byte of scale per {glue:text}`mx_block` elements,
# and a power-of-two scale that can push a block's largest entry past
# {glue:text}`e4m3_max:.0f`, where it saturates.
#
# ```{admonition} Takeaway
# :class: tip
# A running sum stops growing once the addend is below half an ulp, at
# $s^* = 2^{\lfloor\log_2 a\rfloor+m+2}$: {glue:text}`q_terms:,` additions of {glue:text}`q_addend`
# end at {glue:text}`final_bf16` in bf16 (frozen after {glue:text}`stall_bf16_run` steps),
# {glue:text}`final_fp16` in fp16 and {glue:text}`final_fp32` in fp32, each predicted bit for bit.
# In a dot product of {glue:text}`dot_k_max:,` terms the fp16 loop errs by
# {glue:text}`dot_fp16_error:.1%` and an fp32 accumulator by {glue:text}`dot_fp32_error:.1e`:
# accumulate wide.
# ```
#
# ## Exercises
#
# ### Q1 (multi-step) A normalization layer in 16 bits: formats, plateau, dot product
#
# RMSNorm divides a row $x$ of width $D =$ {glue:text}`q1_width:,` by $\sqrt{\frac1D\sum_i x_i^2}$.
# Take $x$ uniform in $[0, 1)$, stored in bf16. (a) Could the squares be formed in fp16 if $|x|$
# reached {glue:text}`q1_large:.0f`? (b) $\sum_i x_i^2$ is the dot product $x \cdot x$: where can a
# bf16 running sum of it end up at most, and how far is that from the exact value? (c) What do
# `torch.sum` and an fp32 loop give?
#
# ```{dropdown} Answer
# (a) No: fp16 squares overflow above {glue:text}`sqrt_fp16_max:.5g`. (b) Each term is at most 1, so
# the sum cannot pass the plateau $2^{m+1} =$ {glue:text}`q1_ceiling:.0f` for bf16, while the exact
# sum is {glue:text}`q1_exact:.1f`: the bf16 loop ends at {glue:text}`q1_bf16:.0f`, and the RMS it
# gives is {glue:text}`q1_rms_ratio:.2f` times too small. Higham's bound is no help: for bf16 it is
# vacuous from $K =$ {glue:text}`vacuous_bf16`. (c) `torch.sum` on the bf16 squares accumulates wide
# and is off by {glue:text}`q1_torch_error:.1e` (within two bf16 roundings, as the cell asserts),
# the fp32 loop by {glue:text}`q1_fp32_error:.1e`.
# ```

# %% tags=["hide-cell"]
row = torch.rand(WIDTH, generator=torch.Generator().manual_seed(SEED)).bfloat16()
squares = row * row  # each rounded to bf16
exact_q1 = (row.double() ** 2).sum().item()
bf16_q1 = summation.sequential_sum(squares, "bf16").item()
ceiling_q1 = summation.plateau_value(1.0, "bf16")
assert bf16_q1 <= ceiling_q1 == 2.0 ** (bf16.mantissa_bits + 1) < exact_q1
torch_q1 = abs(squares.sum().item() - exact_q1) / exact_q1  # relative errors
fp32_q1 = abs(summation.sequential_sum(row.float() ** 2, "fp32").item() - exact_q1) / exact_q1
assert torch_q1 <= 2 * bf16.unit_roundoff  # bf16 products, one rounding
assert fp32_q1 <= DA.higham_bound(WIDTH, "fp32", rounded_products=False)
assert overflow_threshold < LARGE_X
for name, value in [("width", WIDTH), ("ceiling", ceiling_q1), ("exact", exact_q1),
                    ("bf16", bf16_q1), ("rms_ratio", math.sqrt(exact_q1 / bf16_q1)),
                    ("torch_error", torch_q1), ("fp32_error", fp32_q1)]:
    glue(f"q1_{name}", value)

# %% [markdown]
# ### Q2 (find the error) The normalization epsilon in fp16
#
# A widely shared write-up on mixed precision says: *"In fp16 the smallest normal number is about
# 6e-5, so the normalization epsilon 1e-5 cannot be represented accurately; this is why layer
# normalization must be kept in fp32."* What is wrong, and what does happen to
# $\text{var} + \varepsilon$ in 16 bits?
#
# ```{dropdown} Answer
# $10^{-5}$ is a subnormal in fp16, stored as {glue:text}`q2_stored` (relative error
# {glue:text}`q2_rel:.1e`): representable, just with fewer significant bits. What removes
# $\varepsilon$ is the plateau rule: $\text{var} + \varepsilon$ rounds back to var as soon as
# $\varepsilon$ is below half an ulp of var, which in fp16 happens for every var $\ge$
# {glue:text}`q2_fp16_from` and in bf16, where $10^{-5}$ is a normal number, already from
# {glue:text}`q2_bf16_from`. That is harmless: $\varepsilon$ only matters when var is tiny, where it
# survives. The real fp16 hazards of a normalization are the squares overflowing and the sum of
# squares stalling (Q1).
# ```

# %% tags=["hide-cell"]
stored_eps = torch.tensor(NORM_EPS).half().item()
assert 0 < stored_eps < fp16.smallest_normal
absorbed_from = {}
for fmt in ("fp16", "bf16"):
    dtype = precision.FORMATS[fmt].dtype
    powers = [2.0**e for e in range(-20, 4)]
    absorbed = [v for v in powers if (torch.tensor(v, dtype=dtype) + NORM_EPS).item() == v]
    absorbed_from[fmt] = min(absorbed)  # every larger power of two absorbs it too
    assert absorbed == [v for v in powers if v >= absorbed_from[fmt]]
    assert NORM_EPS < precision.ulp(absorbed_from[fmt], fmt) / 2 <= 2 * NORM_EPS  # the plateau rule
assert absorbed_from["bf16"] < absorbed_from["fp16"]
for name, value in [("stored", stored_eps), ("rel", abs(stored_eps - NORM_EPS) / NORM_EPS),
                    ("fp16_from", absorbed_from["fp16"]), ("bf16_from", absorbed_from["bf16"])]:
    glue(f"q2_{name}", value)

# %% [markdown]
# ### Q3 (code) The fields of a stored number
#
# `bit_fields.decompose` finds a number's fields with exact fractions. A kernel finds them with
# integer operations on the stored word: reinterpret its bits as an integer of the same width
# (`t.view(torch.int16)` for a 16-bit tensor; no bit changes), then shift and mask. Complete
# `fields(x, fmt)`: cast `x` to the format's torch dtype, and return its sign bit $S$, exponent
# field $E$ and mantissa field $M$ as integers, using only `.to`, `.view`, `>>` and `&`. The
# hidden cell checks your function against `decompose` for {glue:text}`q3_cases` in fp32, fp16, bf16
# and fp8 e5m2, and reads each value back from the three fields.

# %%
def fields(x: float, fmt: precision.FloatFormat) -> tuple[int, int, int]:  # <- your code here
    """(S, E, M) of `x` stored in `fmt.dtype`: the sign bit, exponent and mantissa fields."""
    raise NotImplementedError("cast, view the bits as an integer, shift and mask")


# %% tags=["hide-cell"]
# The book's solution (opened on demand). `solved_by` checks the reader's function once it is
# written, and the book's while it is not.
def fields_solution(x, fmt):
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    stored = torch.tensor([x], dtype=torch.float64).to(fmt.dtype)  # one rounding, from x itself
    word = stored.view(formats.WORDS[fmt.bits]).item() % 2**fmt.bits  # the bits, as an unsigned int
    return word >> (e + m), (word >> m) & (2**e - 1), word & (2**m - 1)


for f, x in itertools.product(map(precision.FORMATS.get, ("fp32", "fp16", "bf16", "fp8_e5m2")),
                             BIT_CASES):
    (sign, e_field, m_field), whose = solved_by(fields, fields_solution, x, f)
    b = bit_fields.decompose(x, f)
    assert (sign, e_field, m_field) == (b.sign, int(b.exponent, 2), int(b.mantissa, 2)), (f.name, x)
    lead, exponent = (1, e_field - f.bias) if e_field else (0, f.emin)  # normal or subnormal
    assert (-1) ** sign * (lead + m_field / 2**f.mantissa_bits) * 2.0**exponent == b.value
q3 = fields_solution(0.1, bf16)  # the worked example: S, E, M
for name, value in [("cases", ", ".join(map(str, BIT_CASES))), ("e", q3[1]), ("m", q3[2]),
                    ("word", bit_fields.decompose(0.1, bf16).pattern), ("bias", bf16.bias),
                    ("value", (1 + q3[2] / 2**7) * 2.0 ** (q3[1] - bf16.bias))]:
    glue(f"q3_{name}", value)
print(f"checked: {whose} solution, {len(BIT_CASES)} numbers in 4 formats")

# %% [markdown]
# ```{dropdown} Answer
# The sign is the top bit, `word >> (e + m)`; the exponent field is the next $e$ bits,
# `(word >> m) & (2**e - 1)`; the mantissa field is the low $m$ bits, `word & (2**m - 1)`. Two
# details: cast from the float64 `x` directly (through fp32 first, a number could be rounded twice),
# and take the word modulo $2^{\text{bits}}$, since torch's integer view is signed. For 0.1 in bf16
# the word is {glue:text}`q3_word`: $E =$ {glue:text}`q3_e`, $M =$ {glue:text}`q3_m`, and the value
# read back is $(1 + M/2^7) \cdot 2^{E - \text{bias}}$ (bias {glue:text}`q3_bias`) $=$
# {glue:text}`q3_value`, not 0.1.
# A zero exponent field means a subnormal: no leading 1, exponent $e_\min$.
# ```
#
# ### Q4 A token counter in 16 bits
#
# A training loop keeps the number of tokens it has seen in a float tensor of the model's dtype,
# and adds {glue:text}`q4_tokens:,` tokens at every step. After how many steps does the counter go
# wrong, and what does it show from then on, in bf16, in fp16 and in fp32?
#
# ```{dropdown} Answer
# {glue:text}`q4_tokens:,` is a power of two, $2^p$, stored exactly in every format, and a sum of
# $a = 2^p$ stops one binade below the napkin formula, at $2^{p+m+1}$ (ties to even). bf16: the
# counter stops at {glue:text}`q4_plateau_bf16:,.0f` tokens after {glue:text}`q4_stall_bf16` steps,
# and every later step adds nothing. fp16: its plateau {glue:text}`q4_plateau_fp16:,.0f` lies beyond
# its largest number {glue:text}`fp16_max:,.0f`, so the range runs out first: at step
# {glue:text}`q4_inf_step` the sum {glue:text}`q4_inf_exact:,` rounds to `inf`. fp32: it stops at
# {glue:text}`q4_plateau_fp32:.3g` tokens after {glue:text}`q4_stall_fp32:,` steps. The cell
# measures the 16-bit counters for {glue:text}`q4_steps` steps with torch and checks them against
# `plateau_sum`. Count in an integer.
# ```

# %% tags=["hide-cell"]
p = int(math.log2(TOKENS_PER_STEP))
plateau = {f: 2.0 ** (p + precision.FORMATS[f].mantissa_bits + 1) for f in ("bf16", "fp16", "fp32")}
counter = {f: summation.plateau_sum(TOKENS_PER_STEP, 10**12, f) for f in plateau}  # no torch
assert 2**p == TOKENS_PER_STEP and [counter[f].final for f in ("bf16", "fp32")] == [
    plateau["bf16"], plateau["fp32"]] and plateau["fp16"] > fp16.max  # fp16: the range runs out
for f in ("bf16", "fp16"):  # measured: one torch addition per step, for longer than bf16 counts
    measured = summation.running_sum(TOKENS_PER_STEP, COUNTER_STEPS, f, f).double().tolist()
    assert measured == summation.plateau_sum(TOKENS_PER_STEP, COUNTER_STEPS, f).trajectory()
    assert measured[-1] == counter[f].final and counter[f].stall_step < COUNTER_STEPS
inf_step = counter["fp16"].stall_step  # the addition that overflowed
for name, value in [("tokens", TOKENS_PER_STEP), ("steps", COUNTER_STEPS),
                    ("plateau_bf16", plateau["bf16"]), ("plateau_fp16", plateau["fp16"]),
                    ("plateau_fp32", plateau["fp32"]), ("stall_bf16", counter["bf16"].stall_step),
                    ("stall_fp32", counter["fp32"].stall_step), ("inf_step", inf_step),
                    ("inf_exact", inf_step * TOKENS_PER_STEP)]:
    glue(f"q4_{name}", value)

# %% [markdown]
# ## Summary
#
# - A format is exponent bits $e$ (range), mantissa bits $m$ (precision) and an inf/NaN convention
#   (e4m3fn: no inf, two NaNs); every limit follows from them and matches `torch.finfo`.
# - Spacing is $2^{E-m}$ inside each binade; bf16 has fp32's range but
#   {glue:text}`bf16_over_fp16_spacing:.0f` times coarser spacing than fp16.
# - A running sum freezes at $s^* = 2^{\lfloor\log_2 a\rfloor+m+2}$; `plateau_sum` predicts every
#   partial sum bit for bit, and bf16 is the worst format for a sum: precision helps, range does
#   not.
# - Remedies: wide accumulators (`torch.sum`, fp16/bf16 matrix units, whose fp32 additions
#   truncate), Kahan summation, stochastic rounding (unbiased on average, with a spread of about
#   $\sqrt{n}$ half-ulps). fp32 master weights fix accumulation; loss scaling fixes range, a
#   different problem.
# - fp8 needs a scale: without one most of a small tensor flushes to zero; one scale per tensor
#   lets an outlier push the rest out of range; one per block of {glue:text}`mx_block` (MX)
#   confines the damage to the outlier's block.
# - Higham's bound is vacuous for fp16 sums from {glue:text}`vacuous_fp16:,` terms; fp8 tensor-core
#   accumulation on Hopper keeps about 14 bits, so fp8 GEMMs promote partial sums to fp32.
