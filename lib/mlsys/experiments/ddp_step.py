"""A data-parallel training step taken apart: where its time goes, and what each DDP variant saves.

One launch of `world_size` ranks trains the book's model (next-token loss, AdamW) and measures:
- **probes**: all-reduces of a few sizes, fitted to the alpha-beta model (`accounting.comms`), so
  communication can be predicted from bytes on this very run;
- **variants**: forward, backward, communication (`finish_gradient_synchronization`) and optimizer
  of naive, flat, overlapped and bucketed DDP, with the all-reduce launches and bytes counted
  (`distributed.comms.count_bytes`) and the communication predicted: one all-reduce per tensor
  (naive), one for all (flat), and for the overlapped ones what is left after the backward
  (`accounting.comms.overlap_exposed_s`);
- **buckets**: bucketed DDP across bucket sizes, measured and modelled (`best_bucket_cap`);
- **torch**: our bucketed DDP and `torch.nn.parallel.DistributedDataParallel` (same bucket cap,
  buffers broadcast once as ours are), alternating step by step in the same run;
- **accumulation**: K micro-batches per optimizer step, with `no_sync` and without;
- **zero**: what each rank holds after a step of ZeRO stages 0, 1 and 2, and the bytes it sent.
A sample is the slowest rank's, step by step. A machine with one GPU runs one rank (no link is
crossed) and says so. `third_party_rows` predicts the seed's 2-GPU xl run from its own all-reduce
table. Used in: §sec-data-parallel (chapter 08).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from mlsys import bench, env, third_party
from mlsys.accounting import activations
from mlsys.accounting import comms as C
from mlsys.accounting import zero as Z
from mlsys.book import Table, num, verdict
from mlsys.experiments import Experiment, timing_fields, timing_of
from mlsys.experiments.allreduce_bench import fit_row, time_all_reduces
from mlsys.models.config import TransformerConfig

PHASES = ("forward", "backward", "communication", "optimizer")
VARIANTS = ("naive", "flat", "overlapped", "bucketed")
MIB = 2**20


@dataclass(frozen=True)
class Sizes:
    preset: str
    world_size: int
    batch: int  # per rank; divisible by every micro-batch count
    seq: int
    warmup: int
    steps: int
    bucket_sizes_mb: tuple[float, ...]
    micro_batches: tuple[int, ...]
    probe_bytes: tuple[int, ...]


SIZES = {
    "smoke": Sizes("debug", 2, 2, 32, 1, 3, (0.05, 0.25, 25.0), (1, 2), (2**12, 2**16, 2**22)),
    "cpu": Sizes("laptop", 2, 4, 64, 2, 8, (0.5, 2.0, 8.0, 25.0), (1, 2, 4),
                 (2**12, 2**16, 2**20, 2**25)),
    "gpu": Sizes("medium", 2, 4, 512, 3, 10, (1.0, 5.0, 25.0, 100.0), (1, 2, 4),
                 (2**16, 2**20, 2**24, 2**28)),
}


# --- on each rank ---------------------------------------------------------------------------------


def measure(rank, s: Sizes) -> dict[str, Any]:
    """Everything the experiment times on one rank (runs inside `distributed.launch`)."""
    import contextlib
    import gc

    import torch
    import torch.distributed as dist

    from mlsys.distributed import comms, ddp, zero
    from mlsys.models.transformer import Transformer
    from mlsys.training import next_token_loss, training_state_bytes

    cfg, dev, group = TransformerConfig.preset(s.preset), rank.device, rank.group
    gen = torch.Generator().manual_seed(1_000 + rank.rank)
    tokens = torch.randint(cfg.vocab_size, (s.batch, s.seq + 1), generator=gen).to(dev)
    adamw = torch.optim.AdamW

    def fresh():
        if dev.type == "cuda":  # free the previous part's model before the next one
            gc.collect()
            torch.cuda.empty_cache()
        model = Transformer(cfg).to(dev)
        model.init_weights(seed=0)
        return model

    def now() -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    def step(wrapped, opt, micro: int = 1, sync_each: bool = False) -> list[float]:
        """Seconds of forward, backward, communication and optimizer in one optimizer step."""
        dist.barrier(group=group)
        spent = [0.0] * 4
        for i, chunk in enumerate(tokens.chunk(micro)):
            sync = sync_each or i == micro - 1
            with contextlib.nullcontext() if sync else wrapped.no_sync():
                t0 = now()
                loss = next_token_loss(wrapped, chunk) / micro
                t1 = now()
                loss.backward()
                t2 = now()
                if sync:
                    wrapped.finish_gradient_synchronization()
                t3 = now()
            spent[0], spent[1], spent[2] = spent[0] + t1 - t0, spent[1] + t2 - t1, \
                spent[2] + t3 - t2
        t0 = now()
        opt.step()
        opt.zero_grad(set_to_none=True)
        spent[3] = now() - t0
        return spent

    def timed(wrapped, **kw) -> dict[str, Any]:
        opt = adamw(wrapped.parameters())
        with comms.count_bytes() as count:  # the first step, counted, is also a warm-up
            step(wrapped, opt, **kw)
        samples = [step(wrapped, opt, **kw) for _ in range(s.warmup + s.steps)]
        return {"phases": samples[s.warmup:], "calls": count.calls["all_reduce"],
                "sent_bytes": count.sent_bytes}

    out: dict[str, Any] = {"probe": time_all_reduces(rank, s.probe_bytes, 1, s.steps)}
    for variant in VARIANTS:
        wrapped = ddp.apply_ddp(fresh(), variant, group=group)
        out[variant] = timed(wrapped)
    out["tensor_bytes"] = [p.numel() * p.element_size() for p in wrapped.trainable][::-1]
    out["buckets"] = {}
    for mb in s.bucket_sizes_mb:
        wrapped = ddp.BucketedDDP(fresh(), group, bucket_size_mb=mb)
        out["buckets"][mb] = {**timed(wrapped), "bucket_bytes": [
            sum(p.numel() * p.element_size() for p in b) for b in wrapped.buckets]}
    out["torch"] = _against_torch(step, fresh, group, dev, s)
    out["accumulation"] = []
    for k in s.micro_batches:
        for sync_each in (False, True) if k > 1 else (False,):
            wrapped = ddp.BucketedDDP(fresh(), group)
            out["accumulation"].append({"micro_batches": k, "sync_each": sync_each,
                                        **timed(wrapped, micro=k, sync_each=sync_each)})
    del wrapped
    out["zero"] = []
    for stage in (0, 1, 2):
        model = fresh()
        if stage == 0:
            wrapped, opt = ddp.BucketedDDP(model, group), adamw(model.parameters())
        else:
            wrapped = None
            opt = zero.ShardedOptimizer(model.parameters(), adamw, group=group, stage=stage,
                                        reduce_gradients=True)
        with comms.count_bytes() as count:
            next_token_loss(wrapped or model, tokens).backward()
            if wrapped is not None:
                wrapped.finish_gradient_synchronization()
            opt.step()
        held = training_state_bytes(model, opt)  # before zero_grad: the gradients still held
        out["zero"].append({"stage": stage, "held": held, "sent_bytes": count.sent_bytes,
                            "owned_numel": getattr(opt, "owned_numel", None)})
        del model, wrapped, opt
    return out


def _against_torch(step, fresh, group, dev, s: Sizes) -> dict[str, Any]:
    """Our bucketed DDP and torch's DDP (25 MiB buckets, buffers broadcast once), alternating
    which goes first, step by step."""
    import inspect

    import torch

    from mlsys.distributed import ddp

    ours = ddp.BucketedDDP(fresh(), group, bucket_size_mb=25.0)
    options = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    once = ({"forward_sync_buffers": False} if "forward_sync_buffers" in options  # torch 2.13+
            else {"broadcast_buffers": False})
    theirs = torch.nn.parallel.DistributedDataParallel(
        fresh(), device_ids=[dev.index] if dev.type == "cuda" else None, process_group=group,
        bucket_cap_mb=25, **once)
    theirs.finish_gradient_synchronization = lambda: None  # torch syncs inside the backward
    pair = {"ours": (ours, torch.optim.AdamW(ours.parameters())),
            "torch": (theirs, torch.optim.AdamW(theirs.parameters()))}
    times: dict[str, list[float]] = {"ours": [], "torch": []}
    for i in range(2 * (s.warmup + s.steps)):
        for name in ("ours", "torch") if i % 2 else ("torch", "ours"):
            total = sum(step(*pair[name]))
            if i >= 2 * s.warmup:
                times[name].append(total)
    diff = max((a - b).abs().max().item() for a, b in zip(ours.parameters(),
                                                           theirs.parameters(), strict=True))
    return {**times, "max_param_diff": diff}


# --- in the parent --------------------------------------------------------------------------------


def _slowest(per_rank: list[list[float]]) -> bench.Timing:
    return bench.Timing(tuple(max(v) for v in zip(*per_rank, strict=True)), 0, "ranks")


def _phase_rows(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Timings of each phase and of the whole step, the slowest rank's per step."""
    out = {}
    for i, phase in enumerate(PHASES):
        out[phase] = timing_fields(_slowest([[p[i] for p in r["phases"]] for r in per_rank]))
    out["step"] = timing_fields(_slowest([[sum(p) for p in r["phases"]] for r in per_rank]))
    out["all_reduce_calls"] = per_rank[0]["calls"]
    out["sent_bytes"] = per_rank[0]["sent_bytes"]
    return out


def run(s: Sizes, *, device: str | None = None) -> list[dict[str, Any]]:
    """One launch; every part's rows (see the module docstring)."""
    from mlsys.distributed import launch

    device = "cuda" if (device or env.device()) == "cuda" else "cpu"
    world, note = s.world_size, ""
    if device == "cuda":
        import torch

        available = torch.cuda.device_count()
        if available < world:
            world = available
            note = (f"{s.world_size} ranks need {s.world_size} GPUs; this machine has "
                    f"{available}: one rank, whose collectives cross no link")
    cfg = TransformerConfig.preset(s.preset)
    if any(s.batch % k for k in s.micro_batches):
        raise ValueError(f"batch ({s.batch}) must be divisible by every micro-batch count "
                         f"{s.micro_batches}")
    per_rank = launch.run(measure, world, args=(s,), device=device, timeout_s=600,
                          collective_timeout_s=300)
    first = per_rank[0]
    rows: list[dict[str, Any]] = []
    for size in s.probe_bytes:
        rows.append({"kind": "probe", "message_bytes": size,
                     **timing_fields(_slowest([r["probe"][size] for r in per_rank]))})
    if world > 1:
        rows.append(fit_row([r["message_bytes"] for r in rows], [r["median_s"] for r in rows],
                            world))
    tensor_bytes = first["tensor_bytes"]
    for variant in VARIANTS:
        rows.append({"kind": "variant", "variant": variant,
                     **_phase_rows([r[variant] for r in per_rank])})
    for mb in s.bucket_sizes_mb:
        rows.append({"kind": "bucket", "bucket_size_mb": mb,
                     "bucket_bytes": first["buckets"][mb]["bucket_bytes"],
                     **_phase_rows([r["buckets"][mb] for r in per_rank])})
    rows.append({"kind": "torch", "ours": timing_fields(_slowest([r["torch"]["ours"]
                                                                 for r in per_rank])),
                 "torch": timing_fields(_slowest([r["torch"]["torch"] for r in per_rank])),
                 "max_param_diff": max(r["torch"]["max_param_diff"] for r in per_rank)})
    for i, acc in enumerate(first["accumulation"]):
        k = acc["micro_batches"]
        rows.append({"kind": "accumulation", "micro_batches": k, "sync_each": acc["sync_each"],
                     "saved_activation_bytes": activations.saved_bytes(
                         cfg, s.batch // k, s.seq).total_bytes,
                     **_phase_rows([r["accumulation"][i] for r in per_rank])})
    n_params = sum(tensor_bytes) // 4
    for r, mine in enumerate(per_rank):
        for z in mine["zero"]:
            stage, shard = z["stage"], z["owned_numel"]
            rows.append({"kind": "zero", "rank": r, "stage": stage, "held": z["held"],
                         "owned_numel": shard, "sent_bytes": z["sent_bytes"],
                         "predicted": Z.zero_memory_breakdown(n_params, world, stage,
                                                              shard_params=shard),
                         "ideal": Z.zero_memory_breakdown(n_params, world, stage),
                         "predicted_sent_bytes": sum(Z.zero_sent_bytes(n_params, world,
                                                                       stage).values())})
    rows.append({"kind": "setup", "preset": s.preset, "world_size": world, "batch": s.batch,
                 "seq": s.seq, "n_params": n_params, "tensor_bytes": tensor_bytes,
                 "device": env.device_name(), "backend": launch.default_backend(device),
                 "note": note})
    return rows


# --- reading the rows (live or recorded) ----------------------------------------------------------


def setup(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in rows if r["kind"] == "setup")


def alpha_beta(rows: list[dict[str, Any]]) -> C.AlphaBeta | None:
    """The alpha-beta fit of this run's probes (None with one rank, or if the fit failed)."""
    r = next((r for r in rows if r["kind"] == "fit"), None)
    if r is None or "error" in r:
        return None
    return C.AlphaBeta("all_reduce", setup(rows)["world_size"], r["alpha_s"], r["bytes_per_s"],
                       r["per_call_s"], ())


def _backward_s(rows: list[dict[str, Any]]) -> float:
    return next(r for r in rows if r.get("variant") == "naive")["backward"]["median_s"]


def predicted_communication_s(rows: list[dict[str, Any]], variant: str) -> float | None:
    """Communication after the backward predicted from bytes and the fitted alpha and beta:
    one all-reduce per tensor (naive), one of all (flat), the exposed rest of per-tensor or
    25 MiB-bucket all-reduces started during the backward (overlapped, bucketed)."""
    fit, st = alpha_beta(rows), setup(rows)
    if fit is None:
        return None
    sizes, w = st["tensor_bytes"], st["world_size"]
    ab = {"alpha_s": fit.alpha_s, "bytes_per_s": fit.bytes_per_s}
    if variant == "naive":
        return C.all_reduces_s(sizes, w, **ab)
    if variant == "flat":
        return C.all_reduces_s([sum(sizes)], w, **ab)
    groups = sizes if variant == "overlapped" else C.bucket_bytes(sizes, 25.0 * MIB)
    return C.overlap_exposed_s(groups, _backward_s(rows), w, **ab)


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
        model = "" if fit is None else num(1e3 * C.overlap_exposed_s(
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


def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Sentences computed from the rows: breakdown, flat, overlap, buckets, torch, accumulation,
    zero. Timing sentences are withheld when the steps were too noisy."""
    st, fit = setup(rows), alpha_beta(rows)
    v = {r["variant"]: r for r in rows if r["kind"] == "variant"}
    timings = {f"{n} {p}": timing_of(r[p]) for n, r in v.items() for p in ("step",
                                                                            "communication")}
    problems = bench.noise_problems(timings)
    if st["world_size"] == 1:
        alone = f"one rank: nothing crosses a link ({st['note']})"
        return dict.fromkeys(("breakdown", "flat", "overlap", "buckets", "torch",
                              "accumulation", "zero"), alone)
    if fit is None:  # the probes' times did not grow with their size: no prediction to show
        problems.append(next(r for r in rows if r["kind"] == "fit")["error"])
    text = _timing_verdicts(rows, v, fit, st) if fit is not None else dict.fromkeys(
        ("breakdown", "flat", "overlap", "buckets"), "")
    for key in ("breakdown", "flat", "overlap", "buckets"):
        text[key] = verdict(text[key], problems)
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
    text["overlap"] = "; ".join(
        f"{n}: {v[n]['communication']['median_s'] * 1e3:.3g} ms left after the backward "
        f"(model {predicted_communication_s(rows, n) * 1e3:.3g} ms), step "
        f"{v[n]['step']['median_s'] / naive['step']['median_s']:.2f}x naive's"
        for n in ("overlapped", "bucketed"))
    caps = [r for r in rows if r["kind"] == "bucket"]
    best_measured = min(caps, key=lambda r: r["communication"]["median_s"])
    cap, _ = C.best_bucket_cap(st["tensor_bytes"], _backward_s(rows), st["world_size"],
                               alpha_s=fit.alpha_s, bytes_per_s=fit.bytes_per_s,
                               caps_bytes=[r["bucket_size_mb"] * MIB for r in caps])
    text["buckets"] = (f"the least exposed communication came with "
                       f"{num(best_measured['bucket_size_mb'])} MiB buckets; the model picks "
                       f"{num(cap / MIB)} MiB")
    return text


def _count_verdicts(rows) -> dict[str, str]:
    text = {}
    t = next(r for r in rows if r["kind"] == "torch")
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
                            f" while the gradients stayed the same size")
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
    t = next(r for r in rows if r["kind"] == "torch")
    ours, theirs = timing_of(t["ours"]), timing_of(t["torch"])
    ratio = ours.median_s / theirs.median_s
    met = "within" if ratio <= TORCH_TARGET else "above"
    return verdict(f"{ratio:.2f}x, {met} the target of {TORCH_TARGET:.2f}x (on "
                   f"{setup(rows)['world_size']} {setup(rows)['backend']} ranks of "
                   f"{setup(rows)['device']})",
                   bench.noise_problems({"ours": ours, "torch": theirs}))


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
    from mlsys.plotting import COLORS, finish, stacked_bars

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


def third_party_rows() -> list[dict[str, Any]]:
    """The seed's xl runs beside the communication its own 2-GPU all-reduce table predicts:
    naive, one all-reduce per tensor of the xl model; flat, one of everything."""
    import torch

    from mlsys.experiments.allreduce_bench import third_party_fit
    from mlsys.models.transformer import Transformer

    with torch.device("meta"):
        model = Transformer(TransformerConfig.preset("xl"))
    sizes = [p.numel() * 4 for p in model.parameters()]
    fit = third_party_fit()
    ab = {"alpha_s": fit.alpha_s, "bytes_per_s": fit.bytes_per_s}
    predicted = {"naive": C.all_reduces_s(sizes, 2, **ab), "flat": C.all_reduces_s([sum(sizes)],
                                                                                   2, **ab)}
    ready = sizes[::-1]  # the backward meets the last layers first
    buckets = C.bucket_bytes(ready, 25.0 * MIB)
    return [{"label": r.label, "mode_flag": r.mode_flag, "communication_s": r.communication_s,
             "step_s": r.total_s, "backward_s": r.backward_s, "n_tensors": len(sizes),
             "grad_bytes": sum(sizes), "predicted_naive_s": predicted["naive"],
             "predicted_flat_s": predicted["flat"],
             "predicted_overlapped_s": C.overlap_exposed_s(ready, r.backward_s, 2, **ab),
             "predicted_bucketed_s": C.overlap_exposed_s(buckets, r.backward_s, 2, **ab)}
            for r in third_party.CS336_STUDENT_DDP_XL]


def third_party_table(rows: list[dict[str, Any]]) -> Table:
    """The seed's xl runs (`third_party_rows`) beside the communication their fit predicts."""
    return Table(["their run", "--ddp-mode", "step ms", "backward ms", "communication ms",
                  "predicted: naive", "flat", "25 MiB buckets, overlapped"],
                 [[r["label"], r["mode_flag"] or "not shown", num(r["step_s"] * 1e3),
                   num(r["backward_s"] * 1e3), num(r["communication_s"] * 1e3),
                   num(r["predicted_naive_s"] * 1e3), num(r["predicted_flat_s"] * 1e3),
                   num(r["predicted_bucketed_s"] * 1e3)] for r in rows])


EXPERIMENT = Experiment(
    name="ddp_step",
    chapter="08_data_parallel",
    description="DDP step breakdown; naive/flat/overlapped/bucketed; buckets; vs torch DDP; ZeRO",
    gpu_seconds=150,
    sizes=SIZES,
    run=run,
)
