"""mlsys.distributed.pp on 2 gloo ranks: GPipe and 1F1B by hand, and torch.distributed.pipelining
(`torch_strategies.torch_pipeline_step`), train like one process; each stage runs the accounting's
schedule and sends its bytes.

One launch serves every case; rank functions live at module level (the ranks import this file).
"""

import pytest
import torch
from parallel_cases import SETUP, assert_matches, errors, reference

from mlsys.accounting import parallel, parallel_traffic
from mlsys.distributed import harness, pp, torch_strategies

CFG, STEPS = SETUP.cfg, SETUP.steps
M = 4  # micro-batches
CASES = {"gpipe": ("gpipe", False), "1f1b": ("1f1b", False), "torch gpipe": ("gpipe", True),
         "torch 1f1b": ("1f1b", True)}


def train(rank, schedule, theirs):
    stage = pp.apply_pp(SETUP.model(), rank.group)
    names = [stage.model_name(n) for n, _ in stage.named_parameters()]
    steps = []  # what pipeline_step returned, step by step

    def step(i):
        batch = SETUP.tokens(i)
        if theirs:
            return torch_strategies.torch_pipeline_step(stage, batch[:, :-1], batch[:, 1:],
                                                        microbatches=M, schedule=schedule)
        steps.append(pp.pipeline_step(stage, batch[:, :-1], batch[:, 1:], microbatches=M,
                                      schedule=schedule))
        return steps[-1].loss

    def full(grads):
        return {stage.model_name(n): p.grad.clone() if grads else p.detach()
                for n, p in stage.named_parameters()}

    out = harness.train(SETUP, stage.parameters(), step, full) | {"names": names}
    if not theirs:
        out["order"], out["busy_s"], out["span_s"] = (steps[0].order, steps[0].busy_s,
                                                      steps[0].span_s)
    return out


def misuse(rank):
    stage = pp.apply_pp(SETUP.model(), rank.group)
    tokens = SETUP.tokens(0)
    return errors(lambda: pp.pipeline_step(stage, tokens[:6, :-1], tokens[:6, 1:],
                                           microbatches=4),
                  lambda: pp.pipeline_step(SETUP.model(), tokens, tokens, microbatches=1),
                  lambda: pp.pipeline_step(stage, tokens, tokens, microbatches=1, schedule="zb"))


def all_cases(rank):
    return {name: train(rank, *case) for name, case in CASES.items()} | {"misuse": misuse(rank)}


@pytest.fixture(scope="module")
def results():
    return harness.on_ranks(all_cases, 2)


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
    activation = SETUP.batch // M * SETUP.seq * CFG.d_model * 4
    for stage, r in enumerate(results):
        assert tuple(r[schedule]["order"]) == parallel.pipeline_schedule(stage, 2, M, schedule)
        assert r[schedule]["sent"] == parallel_traffic.pp_sent_bytes(
            stage, 2, microbatches=M, activation_bytes=activation)
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
        pp.PipelineStage(torch.nn.Linear(2, 2), 0, 2, None)
    with pytest.raises(ValueError, match=r"pp \(5\) must be <= n_layers \(4\)"):
        pp.PipelineStage(SETUP.model(), 0, 5, None)
    tokens = SETUP.tokens(0)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):  # no group
        torch_strategies.torch_pipeline_step(pp.PipelineStage(SETUP.model(), 0, 2, None),
                                             tokens, tokens, microbatches=1)


def test_a_stage_outside_the_pipeline_is_a_clear_error():
    model = SETUP.model()
    with pytest.raises(ValueError, match=r"^stage \(1\) must be < n_stages \(1\): stages are "
                                         "numbered from 0$"):
        pp.PipelineStage(model, stage=1, n_stages=1, group=None)
    with pytest.raises(ValueError, match="stage must be an integer >= 0, got -1"):
        pp.PipelineStage(model, stage=-1, n_stages=2, group=None)
    with pytest.raises(TypeError, match="stage must be an integer, got 1.0"):
        pp.PipelineStage(model, stage=1.0, n_stages=2, group=None)
    with pytest.raises(TypeError, match="group must be a torch.distributed.ProcessGroup"):
        pp.PipelineStage(model, stage=0, n_stages=2, group="pp")
    assert pp.PipelineStage(model, stage=1, n_stages=2, group=None).first_block == 2
