"""A data-parallel training step taken apart: where its time goes, and what each DDP variant saves.

One launch of `world_size` ranks trains the book's model (next-token loss, AdamW) and measures:
- **probes**: all-reduces of a few sizes, fitted to the alpha-beta model (`accounting.comms`), so
  communication can be predicted from bytes on this very run;
- **variants**: forward, backward, communication (`finish_gradient_synchronization`) and optimizer
  of naive, flat, overlapped and bucketed DDP, with the all-reduce launches and bytes counted
  (`distributed.comms.count_bytes`) and the communication predicted: one all-reduce per tensor
  (naive), one for all (flat), and for the overlapped ones what is left after the backward
  (`accounting.buckets.overlap_exposed_s`);
- **buckets**: bucketed DDP across bucket sizes, measured and modelled (`best_bucket_cap`);
- **torch**: our bucketed DDP and `torch.nn.parallel.DistributedDataParallel` (same bucket cap,
  buffers broadcast once as ours are), alternating step by step in the same run;
- **accumulation**: K micro-batches per optimizer step, with `no_sync` and without;
- **zero**: what each rank holds after a step of ZeRO stages 0, 1 and 2, and the bytes it sent.
A sample is the slowest rank's, step by step. A machine with one GPU runs one rank (no link is
crossed) and says so. `ddp_step_seed` predicts the seed's 2-GPU xl run from its own all-reduce
table. What runs (on each rank and in the parent) is `ddp_step_run`; this module reads the rows.
A little over 300 lines: the verdicts (`communication_miss` among them) sit beside the tables and
the plot that show the same rows. Used in: §sec-data-parallel (chapter 08).
"""

from __future__ import annotations

from typing import Any

from mlsys import bench, checks
from mlsys.accounting import comms as comms_cost
from mlsys.accounting.buckets import best_bucket_cap, bucket_bytes, overlap_exposed_s
from mlsys.book import Table, num, verdict
from mlsys.experiments import Experiment, allreduce_bench, kit, timing_of
from mlsys.experiments.ddp_step_run import MIB, PHASES, SIZES, run
from mlsys.experiments.kit import setup

# --- reading the rows (live or recorded) ----------------------------------------------------------


def alpha_beta(rows: list[dict[str, Any]]) -> comms_cost.AlphaBeta | None:
    """The alpha-beta fit of this run's probes (None with one rank, or if the fit failed)."""
    r = next((r for r in rows if r["kind"] == "fit"), None)
    if r is None or "error" in r:
        return None
    return comms_cost.AlphaBeta("all_reduce", setup(rows)["world_size"], r["alpha_s"],
                                r["bytes_per_s"], r["per_call_s"], ())


def _backward_s(rows: list[dict[str, Any]]) -> float:
    return next(r for r in rows if r.get("variant") == "naive")["backward"]["median_s"]


def bucket_mb(rows: list[dict[str, Any]]) -> float:
    """The bucketed variant's cap in MiB (a record from before it was chosen per size: 25)."""
    return setup(rows).get("bucket_mb", 25.0)


def predicted_communication_s(rows: list[dict[str, Any]], variant: str) -> float | None:
    """Communication after the backward predicted from bytes and the fitted alpha and beta:
    one all-reduce per tensor (naive), one of all (flat), the exposed rest of per-tensor or
    bucket all-reduces (`bucket_mb`) started during the backward (overlapped, bucketed)."""
    fit, st = alpha_beta(rows), setup(rows)
    if fit is None:
        return None
    sizes, w = st["tensor_bytes"], st["world_size"]
    ab = {"alpha_s": fit.alpha_s, "bytes_per_s": fit.bytes_per_s}
    if variant == "naive":
        return comms_cost.all_reduces_s(sizes, w, **ab)
    if variant == "flat":
        return comms_cost.all_reduces_s([sum(sizes)], w, **ab)
    groups = sizes if variant == "overlapped" else bucket_bytes(sizes, bucket_mb(rows) * MIB)
    return overlap_exposed_s(groups, _backward_s(rows), w, **ab)


def table(rows: list[dict[str, Any]]) -> Table:
    """The step breakdown of every variant: phases in ms, launches, communication predicted."""
    out = []
    for r in (r for r in rows if r["kind"] == "variant"):
        predicted = predicted_communication_s(rows, r["variant"])
        out.append([r["variant"], *(num(r[p]["median_s"] * 1e3) for p in PHASES),
                    num(r["step"]["median_s"] * 1e3), r["all_reduce_calls"],
                    "" if predicted is None else num(predicted * 1e3)])
    return Table(["DDP", *(f"{p} ms" for p in PHASES), "step ms", "all-reduces",
                  "communication predicted ms"], out)


def bucket_table(rows: list[dict[str, Any]]) -> Table:
    fit, out = alpha_beta(rows), []
    for r in (r for r in rows if r["kind"] == "bucket"):
        model = "" if fit is None else num(1e3 * overlap_exposed_s(
            r["bucket_bytes"], _backward_s(rows), setup(rows)["world_size"], alpha_s=fit.alpha_s,
            bytes_per_s=fit.bytes_per_s))
        out.append([num(r["bucket_size_mb"]), len(r["bucket_bytes"]),
                    num(r["communication"]["median_s"] * 1e3), model,
                    num(r["step"]["median_s"] * 1e3)])
    return Table(["cap MiB", "buckets", "exposed ms", "model ms", "step ms"], out)


def zero_table(rows: list[dict[str, Any]]) -> Table:
    out = []
    for r in (r for r in rows if r["kind"] == "zero"):
        held = r["held"]
        out.append([r["stage"], r["rank"], *(num(held[k] / MIB) for k in
                                            ("weights", "grads", "optimizer")),
                    num(sum(r["predicted"].values()) / MIB), num(sum(r["ideal"].values()) / MIB),
                    num(r["sent_bytes"] / MIB), num(r["predicted_sent_bytes"] / MIB)])
    return Table(["stage", "rank", "weights MiB", "grads MiB", "optimizer MiB",
                  "predicted (its shard) MiB", "ideal (1/n) MiB", "sent MiB",
                  "predicted sent MiB"], out)


MISS = 1.25
"""A variant's communication misses its prediction when it is off by more than this factor and
the prediction lies outside its own p20-p80 band; every variant missing the same way is a
systematic miss of the model, not noise."""


def communication_miss(measured: dict[str, dict[str, float]], predicted: dict[str, float],
                       cause: str = "") -> tuple[str, bool]:
    """(sentence, systematic) for each variant's measured communication (a timing row: median_s,
    p20_s, p80_s) against its `predicted` seconds: systematic when every variant misses (`MISS`)
    the same way, which noise does not do; then `cause` is given."""
    ratio = {n: measured[n]["median_s"] / checks.positive(t, f"predicted[{n!r}]")
             for n, t in predicted.items()}
    listed = ", ".join(f"{n} {r:.2f}x" for n, r in ratio.items())
    slow = [n for n, r in ratio.items() if r >= MISS and measured[n]["p20_s"] > predicted[n]]
    fast = [n for n, r in ratio.items() if r <= 1 / MISS and measured[n]["p80_s"] < predicted[n]]
    said = f"communication took {listed} its prediction"
    if ratio and (len(slow) == len(ratio) or len(fast) == len(ratio)):
        way = "slower" if slow else "faster"
        return (f"{said}: {way} in every variant, each by more than {MISS:g}x and beyond its own "
                f"p20-p80 band, so a systematic miss of the model, not noise"
                + (f"; {cause}" if cause else ""), True)
    if not slow and not fast:
        return f"{said}: no variant misses it beyond {MISS:g}x and its own p20-p80 band", False
    beyond = "; ".join(f"{way} beyond the noise: {', '.join(names)}"
                       for way, names in (("slower", slow), ("faster", fast)) if names)
    rest = "; the rest within it" if len(slow) + len(fast) < len(ratio) else ""
    return (f"{said} ({beyond}{rest}): not a miss every variant shares, so not one bias of the "
            f"model", False)


def _cause(st: dict[str, Any]) -> str:
    """What differs between the probes that fitted alpha and beta and the step's all-reduces."""
    where = (f"on the {st['cores']} cores that {st['world_size']} {st['backend']} ranks share "
             f"with the backward's and optimizer's threads" if st.get("cores") and
             st["backend"] == "gloo" else "beside the backward's kernels")
    return (f"likely cause: the probes that fitted alpha and beta timed all-reduces alone, back "
            f"to back on one buffer, while the step's run {where}, on gradients just written")


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Sentences computed from the rows: breakdown, miss, flat, overlap, buckets, torch,
    accumulation, zero. Timing sentences are withheld when the steps were too noisy, except the
    breakdown and overlap when every variant's communication misses its prediction the same way
    (`communication_miss`): their numbers then show the miss, which noise does not explain."""
    st, fit = setup(rows), alpha_beta(rows)
    v = {r["variant"]: r for r in rows if r["kind"] == "variant"}
    timings = {f"{n} {p}": timing_of(r[p]) for n, r in v.items() for p in ("step",
                                                                            "communication")}
    problems = bench.noise_problems(timings)
    keys = ("breakdown", "miss", "flat", "overlap", "buckets")
    if st["world_size"] == 1:
        alone = f"one rank: nothing crosses a link ({st['note']})"
        return dict.fromkeys((*keys, "torch", "accumulation", "zero"), alone)
    if fit is None:  # the probes' times did not grow with their size: no prediction to show
        problems.append(kit.first(rows, "fit")["error"])
    text, systematic = dict.fromkeys(keys, ""), False
    if fit is not None:
        text = _timing_verdicts(rows, v, fit, st)
        text["miss"], systematic = communication_miss(
            {n: r["communication"] for n, r in v.items()},
            {n: predicted_communication_s(rows, n) for n in v}, _cause(st))
    for key in keys:
        shown = key == "miss" and fit is not None or systematic and key in ("breakdown",
                                                                             "overlap")
        text[key] = verdict(text[key], [] if shown else problems)
    return {**text, **_count_verdicts(rows)}


def _timing_verdicts(rows, v, fit, st) -> dict[str, str]:
    naive = v["naive"]
    shares = {p: naive[p]["median_s"] / naive["step"]["median_s"] for p in PHASES}
    pred = predicted_communication_s(rows, "naive")
    text = {"breakdown": ", ".join(f"{p} {shares[p]:.0%}" for p in PHASES) +
            f" of the naive step; its communication took "
            f"{naive['communication']['median_s'] / pred:.2f}x the {num(pred * 1e3)} ms predicted "
            f"from {len(st['tensor_bytes'])} all-reduces of {num(sum(st['tensor_bytes']) / MIB)} "
            f"MiB in all"}
    flat = v["flat"]
    text["flat"] = (f"flat DDP launched {flat['all_reduce_calls']} all-reduce instead of "
                    f"{naive['all_reduce_calls']} for the same bytes; its communication took "
                    f"{flat['communication']['median_s'] / naive['communication']['median_s']:.2f}"
                    f"x the naive one's")
    n_buckets = len(bucket_bytes(st["tensor_bytes"], bucket_mb(rows) * MIB))
    text["overlap"] = "; ".join(
        f"{n}: {v[n]['communication']['median_s'] * 1e3:.3g} ms left after the backward "
        f"(model {predicted_communication_s(rows, n) * 1e3:.3g} ms), step "
        f"{v[n]['step']['median_s'] / naive['step']['median_s']:.2f}x naive's"
        for n in ("overlapped", "bucketed")) + (
        f" (bucketed: {n_buckets} bucket{'s' * (n_buckets > 1)} of at most "
        f"{num(bucket_mb(rows))} MiB{'; one bucket overlaps nothing' * (n_buckets == 1)})")
    caps = [r for r in rows if r["kind"] == "bucket"]
    best_measured = min(caps, key=lambda r: r["communication"]["median_s"])
    cap, _ = best_bucket_cap(st["tensor_bytes"], _backward_s(rows), st["world_size"],
                             alpha_s=fit.alpha_s, bytes_per_s=fit.bytes_per_s,
                             caps_bytes=[r["bucket_size_mb"] * MIB for r in caps])
    text["buckets"] = (f"the least exposed communication came with "
                       f"{num(best_measured['bucket_size_mb'])} MiB buckets; the model picks "
                       f"{num(cap / MIB)} MiB")
    return text


def _count_verdicts(rows) -> dict[str, str]:
    text = {}
    t = kit.first(rows, "torch")
    ratio = t["ours"]["median_s"] / t["torch"]["median_s"]
    problems_torch = bench.noise_problems({"ours": timing_of(t["ours"]),
                                           "torch": timing_of(t["torch"])})
    text["torch"] = verdict(f"our bucketed DDP's step took {ratio:.2f}x torch's "
                            f"DistributedDataParallel's ({num(t['ours']['median_s'] * 1e3)} vs "
                            f"{num(t['torch']['median_s'] * 1e3)} ms), parameters equal to "
                            f"{t['max_param_diff']:.1g}", problems_torch)
    acc = [r for r in rows if r["kind"] == "accumulation"]
    k = max(r["micro_batches"] for r in acc)
    last = next(r for r in acc if r["micro_batches"] == k and not r["sync_each"])
    each = next(r for r in acc if r["micro_batches"] == k and r["sync_each"])
    one = next(r for r in acc if r["micro_batches"] == 1)
    text["accumulation"] = (f"with {k} micro-batches per step, no_sync sent "
                            f"{num(last['sent_bytes'] / MIB)} MiB per optimizer step and syncing "
                            f"each micro-batch {num(each['sent_bytes'] / MIB)} MiB; saved "
                            f"activations per micro-batch fell "
                            f"{one['saved_activation_bytes'] / last['saved_activation_bytes']:.2f}x"
                            f" while the gradients, replicated, stayed the same size")
    zero = [r for r in rows if r["kind"] == "zero"]
    exact = all(r["held"][k] == r["predicted"][k] for r in zero for k in
                ("weights", "grads", "optimizer"))
    sent = {r["stage"]: r["sent_bytes"] for r in zero if r["rank"] == 0}
    text["zero"] = (f"every rank held {'exactly' if exact else 'not'} the predicted weights, "
                    f"gradients and optimizer state of its shard; stages 1 and 2 sent "
                    f"{sent[1] / sent[0]:.2f}x and {sent[2] / sent[0]:.2f}x stage 0's bytes")
    return text


TORCH_TARGET = 1.05
"""The issue's target: our bucketed DDP's step at most this multiple of torch's DDP's."""


def torch_target(rows: list[dict[str, Any]]) -> str:
    """Our bucketed step / torch's DDP step against `TORCH_TARGET`, withheld when noisy."""
    t = kit.first(rows, "torch")
    ours, theirs = timing_of(t["ours"]), timing_of(t["torch"])
    ratio = ours.median_s / theirs.median_s
    met = "within" if ratio <= TORCH_TARGET else "above"
    return verdict(f"{ratio:.2f}x, {met} the target of {TORCH_TARGET:.2f}x (on "
                   f"{setup(rows)['world_size']} {setup(rows)['backend']} ranks of "
                   f"{setup(rows)['device']})",
                   bench.noise_problems({"ours": ours, "torch": theirs}))


def sentences(said: dict[str, str]) -> Table:
    """Verdicts (`verdicts`, `ddp_step.verdicts`: topic -> sentence) as a narrow table whose cells
    wrap, each sentence once: what a page shows of a run, live or recorded."""
    first: dict[str, str] = {}
    for key, text in said.items():
        first.setdefault(text, key)
    return Table(["", "what the run says"], [[key, text] for text, key in first.items()])


def record_views() -> dict[str, Any]:
    """How the page shows each record of `allreduce_bench` and of this experiment
    (`experiments.show_records`'s `tables` and `shows`): the tables, then the verdicts as
    `sentences`."""
    return {"tables": {"allreduce_bench": [allreduce_bench.table],
                       "ddp_step": [table, bucket_table, accumulation_table, zero_table]},
            "shows": {"allreduce_bench": lambda record: sentences(
                          allreduce_bench.verdicts(record["results"])),
                      "ddp_step": lambda record: sentences(verdicts(record["results"]))}}


def accumulation_table(rows: list[dict[str, Any]]) -> Table:
    """Per optimizer step with K micro-batches: all-reduces, bytes sent, the saved activations of
    one micro-batch, and the step's time."""
    out = []
    for r in (r for r in rows if r["kind"] == "accumulation"):
        out.append([r["micro_batches"], "every micro-batch" if r["sync_each"] else "last only",
                    r["all_reduce_calls"], num(r["sent_bytes"] / MIB),
                    num(r["saved_activation_bytes"] / MIB), num(r["step"]["median_s"] * 1e3)])
    return Table(["micro-batches", "all-reduce after", "all-reduces", "sent MiB",
                  "saved activations per micro-batch MiB", "step ms"], out)


def plot(rows: list[dict[str, Any]], ax) -> None:
    """The step of each variant in phases (medians), with the communication predicted from
    bytes and the fitted alpha and beta marked on top of its backward."""
    from mlsys.plotting import COLORS, finish, stacked_bars  # matplotlib: only when a page draws

    v = [r for r in rows if r["kind"] == "variant"]
    names = [r["variant"] for r in v]
    stacked_bars(ax, names, {p: [r[p]["median_s"] * 1e3 for r in v] for p in PHASES},
                 ylabel="ms (median)")
    predicted = [predicted_communication_s(rows, n) for n in names]
    if all(p is not None for p in predicted):
        ax.plot(names, [(r["forward"]["median_s"] + r["backward"]["median_s"] + p) * 1e3
                        for r, p in zip(v, predicted, strict=True)], "_", ms=30, mew=2,
                color=COLORS["ceiling"], label="communication predicted (top)")
    finish(ax, title=f"one step on {setup(rows)['world_size']} ranks")


EXPERIMENT = Experiment(
    name="ddp_step",
    chapter="08_data_parallel",
    description="DDP step breakdown; naive/flat/overlapped/bucketed; buckets; vs torch DDP; ZeRO",
    gpu_seconds=150,
    sizes=SIZES,
    run=run,
)
