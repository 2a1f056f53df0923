"""mlsys.distributed.pp on 2 gloo ranks: GPipe and 1F1B by hand, and torch.distributed.pipelining,
train like one process; each stage runs the accounting's schedule and sends its bytes.

One launch serves every case; rank functions live at module level (the ranks import this file).
"""

import pytest
import torch
from parallel_cases import (
    BATCH,
    CFG,
    SEQ,
    STEPS,
    assert_matches,
    build,
    optimizer,
    reference,
    tokens,
)

from mlsys.accounting import parallel as P
from mlsys.distributed import comms, launch, pp

M = 4  # micro-batches
CASES = {"gpipe": ("gpipe", False), "1f1b": ("1f1b", False), "torch gpipe": ("gpipe", True),
         "torch 1f1b": ("1f1b", True)}


def train(rank, schedule, theirs):
    stage = pp.apply_pp(build(), rank.group)
    opt = optimizer(stage.parameters())
    out = {"losses": [], "names": [stage.model_name(n) for n, _ in stage.named_parameters()]}
    for step in range(STEPS):
        batch = tokens(step)
        with comms.count_bytes() as count:
            if theirs:
                loss = pp.torch_pipeline_step(stage, batch[:, :-1], batch[:, 1:],
                                              microbatches=M, schedule=schedule)
            else:
                result = pp.pipeline_step(stage, batch[:, :-1], batch[:, 1:], microbatches=M,
                                          schedule=schedule)
                loss = result.loss
        out["losses"].append(loss)
        if step == 0:
            out["grads"] = {stage.model_name(n): p.grad.clone()
                            for n, p in stage.named_parameters()}
            out["sent"], out["calls"] = count.sent_bytes, dict(count.calls)
            if not theirs:
                out["order"], out["busy_s"], out["span_s"] = (result.order, result.busy_s,
                                                              result.span_s)
        opt.step()
        opt.zero_grad()
    out["params"] = {stage.model_name(n): p.detach() for n, p in stage.named_parameters()}
    return out


def misuse(rank):
    stage = pp.apply_pp(build(), rank.group)
    messages = []
    for call in (lambda: pp.pipeline_step(stage, tokens(0)[:6, :-1], tokens(0)[:6, 1:],
                                          microbatches=4),
                 lambda: pp.pipeline_step(build(), tokens(0), tokens(0), microbatches=1),
                 lambda: pp.pipeline_step(stage, tokens(0), tokens(0), microbatches=1,
                                          schedule="zb")):
        try:
            call()
            messages.append("no error")
        except (TypeError, ValueError) as error:
            messages.append(str(error))
    return messages


def all_cases(rank):
    return {name: train(rank, *case) for name, case in CASES.items()} | {"misuse": misuse(rank)}


@pytest.fixture(scope="module")
def results():
    with launch.start(2, timeout_s=60, collective_timeout_s=30) as job:
        return job.run(all_cases, timeout_s=120)


@pytest.mark.parametrize("name", list(CASES))
def test_pipelines_train_like_one_process(results, name):
    ref = reference()
    first, last = results
    assert first[name]["losses"] == [None] * STEPS  # only the last stage computes the loss
    assert last[name]["losses"] == pytest.approx(ref["losses"], rel=1e-6)
    assert first[name]["names"][0] == "token_embedding.weight"
    assert last[name]["names"][0] == f"blocks.{CFG.n_layers // 2}.attn_norm.weight"
    grads = {**first[name]["grads"], **last[name]["grads"]}
    params = {**first[name]["params"], **last[name]["params"]}
    assert_matches(grads, ref["grads"], what=f"{name} grads")
    assert_matches(params, ref["params"], what=f"{name} params")


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_each_stage_runs_the_schedule_and_sends_the_accounted_bytes(results, schedule):
    activation = BATCH // M * SEQ * CFG.d_model * 4
    for stage, r in enumerate(results):
        assert tuple(r[schedule]["order"]) == P.pipeline_schedule(stage, 2, M, schedule)
        assert r[schedule]["sent"] == P.pp_sent_bytes(stage, 2, activation_bytes=activation,
                                                      microbatches=M)
        assert r[schedule]["calls"] == {"barrier": 1, "isend": M, "recv": M}
        assert 0 < r[schedule]["busy_s"] <= r[schedule]["span_s"]


def test_torch_pipelining_sends_the_same_activations_and_some_metadata(results):
    for r in results:
        ours, theirs = r["1f1b"]["sent"], r["torch 1f1b"]["sent"]
        assert ours < theirs < 1.1 * ours  # its first step also exchanges shapes (pickled)


def test_bad_arguments_are_clear_errors(results):
    divisible, kind, schedule = results[0]["misuse"]
    assert "batch (6) is not divisible by microbatches (4)" in divisible
    assert "stage must be a PipelineStage" in kind
    assert "schedule='zb' is not one of" in schedule
    with pytest.raises(TypeError, match="model must be a Transformer"):
        pp.PipelineStage(torch.nn.Linear(2, 2), 0, 2)
    with pytest.raises(ValueError, match=r"pp \(5\) must be <= n_layers \(4\)"):
        pp.PipelineStage(build(), 0, 5)
