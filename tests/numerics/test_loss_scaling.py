"""Dynamic loss scaling (`mlsys.numerics.loss_scaling`): GradScaler's rules, and what fp16 loses."""

import pytest
import torch

from mlsys.numerics.loss_scaling import DynamicLossScaler, underflow


def test_scale_backs_off_on_overflow_and_grows_after_an_interval():
    s = DynamicLossScaler(2.0**10, growth_interval=3)
    actions = [s.update(f) for f in (True, True, False, True, True, True, True)]
    assert actions == ["keep", "keep", "skip and back off", "keep", "keep", "grow", "keep"]
    assert [e.scale for e in s.history] == [2**10, 2**10, 2**10, 2**9, 2**9, 2**9, 2**10]
    assert s.scale == 2**10 and s.skipped == 1 and s.finite_in_a_row == 1


def test_the_scale_follows_torch_grad_scaler_step_for_step():
    """The same overflow pattern drives torch.amp.GradScaler (on a real optimizer) and ours."""
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    theirs = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    ours = DynamicLossScaler(2.0**8, growth_interval=2)
    for finite in (True, False, True, True, True, False, False, True, True):
        p.grad = torch.tensor([1.0, 2.0, 3.0 if finite else float("inf")])
        before = p.detach().clone()
        assert ours.scale == theirs.get_scale()
        grads = [p.grad.clone()]
        theirs.scale(torch.tensor(1.0))  # what a training loop would backward through
        theirs.step(opt)
        theirs.update()
        assert ours.unscale_(grads) is finite
        ours.update(finite)
        assert torch.equal(before, p) is (not finite)  # torch skipped exactly the same steps
    assert ours.scale == theirs.get_scale()


def test_unscale_divides_in_place_and_reports_inf_and_nan():
    s = DynamicLossScaler(4.0)
    g = [torch.tensor([4.0, 8.0]), None, torch.tensor([2.0], dtype=torch.float16)]
    assert s.unscale_(g)
    assert g[0].tolist() == [1.0, 2.0] and g[2].tolist() == [0.5]
    assert not s.unscale_([torch.tensor([1.0, float("nan")])])
    assert s.unscale_([None]) and s.scale_loss(torch.tensor(1.5)).item() == 6.0


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: DynamicLossScaler(0.0), ValueError, "init_scale must be > 0"),
    (lambda: DynamicLossScaler(growth_factor=1.0), ValueError, "growth_factor must be > 1"),
    (lambda: DynamicLossScaler(backoff_factor=1.0), ValueError, "backoff_factor must be < 1"),
    (lambda: DynamicLossScaler(growth_interval=0), ValueError, "growth_interval must be a posit"),
    (lambda: DynamicLossScaler(min_scale=0.0), ValueError, "min_scale must be > 0"),
    (lambda: DynamicLossScaler(0.5), ValueError, "init_scale must be >= min_scale = 1, got 0.5"),
    (lambda: DynamicLossScaler().scale_loss(torch.ones(2)), TypeError, "loss must be a 0-d"),
    (lambda: DynamicLossScaler().unscale_([torch.ones(2, dtype=torch.int64)]), TypeError,
     "floating-point"),
    (lambda: DynamicLossScaler().update(1), TypeError, "finite must be a bool, got 1"),
    (lambda: underflow(torch.ones(2), torch.ones(3)), ValueError, "same shape"),
])
def test_invalid_arguments_are_refused(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_underflow_counts_flushed_subnormal_and_overflowed_entries():
    ref = torch.tensor([1e-9, 1e-6, 1e-2, 1e5, 0.0], dtype=torch.float64)
    u = underflow(ref, ref.to(torch.float16), "fp16")
    assert u.numel == 4  # the reference's zero carries no information
    assert (u.flushed, u.subnormal, u.overflowed) == (0.25, 0.25, 0.25)
    scaled = underflow(ref, (ref * 2.0**10).to(torch.float16), "fp16", scale=2.0**10)
    assert scaled.flushed == 0.0 and scaled.overflowed == 0.25  # 1e5 * 1024 overflows
    assert scaled.median_rel_error < u.median_rel_error


def test_the_scale_stops_at_its_floor_and_says_so():
    """1,200 overflows in a row: GradScaler's rules would halve 2^16 to 0.0 (after 1,091 in a
    Python float); ours stop at min_scale, record it, and warn once."""
    s = DynamicLossScaler()
    with pytest.warns(RuntimeWarning, match="step 17 overflowed at min_scale = 1; skipped") as w:
        actions = [s.update(False) for _ in range(1_200)]
    assert len(w) == 1 and s.scale == 1.0 and s.skipped == 1_200
    assert actions[:16] == ["skip and back off"] * 16  # 2^16 -> 2^0 in 16 halvings
    assert set(actions[16:]) == {"skip at min_scale"}
    assert [e.scale for e in s.history[15:18]] == [2.0, 1.0, 1.0]
    assert s.update(True) == "keep" and s.scale == 1.0  # finite again: it grows from the floor
    low = DynamicLossScaler(min_scale=2.0**-20)
    with pytest.warns(RuntimeWarning, match="step 37 overflowed at min_scale = 9.53674e-07"):
        for _ in range(40):
            low.update(False)
    assert low.scale == 2.0**-20  # a floor of one's own choosing
