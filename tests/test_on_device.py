"""The catalogue on a device gives what it gives on the CPU: every estimator, shaper and
objective, run on a random multi-agent batch moved to ``SPARRING_TEST_DEVICE``, against
the same call on the CPU (values to float32 rounding, keep masks and diagnostics, the
objectives' gradients). A tensor made on the CPU inside a formula fails here first.

Skipped when the device under test is the CPU (there is nothing to compare); bench/gpu.py
runs this file with ``SPARRING_TEST_DEVICE=cuda`` on a GPU."""

import pytest
import torch

from sparring.advantages import ESTIMATORS, compute, list_estimators
from sparring.advantages.shaping import SHAPERS
from sparring.objectives import OBJECTIVES, list_objectives
from sparring.objectives import compute as objective
from tests.turn_batches import random_batch

CLOSE = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture
def accel(device):
    if device.type == "cpu":
        pytest.skip("SPARRING_TEST_DEVICE is the CPU: nothing to compare")
    return device


def _batch(layout="turn", seed=3):
    b = random_batch(seed, episodes=8, agents=2, max_turns=3, groups=3, layout=layout)
    g = torch.Generator().manual_seed(seed)
    return b.with_fields(ref_logp=b.old_logp + 0.1 * torch.randn(b.old_logp.shape, generator=g))


def _options(entry):
    state = entry.extra.get("state")
    return {"state": state()} if state is not None else {}


@pytest.mark.parametrize("name", [e.name for e in list_estimators()])
def test_every_estimator_on_the_device_equals_the_cpu(name, accel):
    entry = ESTIMATORS.get(name)
    b = _batch("trajectory" if entry.layout == "trajectory" else "turn")
    want_adv, want_keep = compute(name, b, **_options(entry))
    got_adv, got_keep = compute(name, b.to(accel), **_options(entry))
    assert got_adv.device.type == accel.type and got_keep.device.type == accel.type
    torch.testing.assert_close(got_adv.cpu(), want_adv, **CLOSE)
    assert torch.equal(got_keep.cpu(), want_keep)


@pytest.mark.parametrize("name", [e.name for e in SHAPERS])
def test_every_shaper_on_the_device_equals_the_cpu(name, accel):
    entry = SHAPERS.get(name)
    b = _batch()
    adv = compute("grpo", b)[0]
    if entry.family == "reward":
        want, got = entry.fn(b), entry.fn(b.to(accel))
        for field in ("reward", "returns"):
            torch.testing.assert_close(getattr(got, field).cpu(), getattr(want, field), **CLOSE)
        return
    want, got = entry.fn(adv, b), entry.fn(adv.to(accel), b.to(accel))
    assert got.device.type == accel.type
    if entry.family == "keep":
        assert torch.equal(got.cpu(), want)
    else:
        torch.testing.assert_close(got.cpu(), want, **CLOSE)


@pytest.mark.parametrize("name", [e.name for e in list_objectives()])
def test_every_objective_on_the_device_equals_the_cpu(name, accel):
    b = _batch()
    adv = compute("grpo", b)[0]
    g = torch.Generator().manual_seed(5)
    logp0 = b.old_logp + 0.2 * torch.randn(b.old_logp.shape, generator=g)
    extra = {}
    if "group" in OBJECTIVES.get(name).needs:
        extra = {"group": b.group, "rewards": b.returns}

    def run(device):
        logp = logp0.to(device).clone().requires_grad_()  # a leaf of its own per device
        moved = {k: v.to(device) for k, v in extra.items()}
        per_tok, diag = objective(name, logp, b.old_logp.to(device), adv.to(device),
                                  b.action_mask.to(device), ref_logp=b.ref_logp.to(device),
                                  **moved)
        per_tok.sum().backward()
        return per_tok.detach().cpu(), {k: v.cpu() for k, v in diag.items()}, logp.grad.cpu()

    (want, want_diag, want_grad), (got, got_diag, got_grad) = run("cpu"), run(accel)
    torch.testing.assert_close(got, want, **CLOSE)
    torch.testing.assert_close(got_grad, want_grad, **CLOSE)
    assert got_diag.keys() == want_diag.keys()
    for key in want_diag:
        torch.testing.assert_close(got_diag[key], want_diag[key], **CLOSE)
