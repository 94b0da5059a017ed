"""The contract every registered estimator keeps (checked on the raw function, because
`compute` relies on it): shape [n, T], finite, exactly zero outside the action mask, its
own storage (no view of a batch field), on a
multi-turn, multi-agent batch with padding and every optional field present."""

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from advantages import OPTIONS, synthetic_batch  # noqa: E402
from sparring.advantages import ESTIMATORS, list_estimators  # noqa: E402

NAMES = [e.name for e in list_estimators()]


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=8, deadline=None)
@given(groups=st.integers(1, 4), rollouts=st.integers(1, 4), T=st.integers(1, 12),
       turns=st.integers(1, 3), agents=st.integers(1, 3), seed=st.integers(0, 10_000))
def test_raw_estimator_is_finite_and_zero_outside_the_mask(name, groups, rollouts, T, turns,
                                                           agents, seed):
    b = synthetic_batch(groups, rollouts, T, turns, agents, seed=seed)
    out = ESTIMATORS[name](b, **OPTIONS.get(name, {}))
    assert out.shape == b.action_mask.shape
    assert torch.isfinite(out).all()
    assert (out[~b.action_mask] == 0).all()
    # the result is the caller's to overwrite (`shaping.shaped` writes shapers into it)
    fields = [v for v in vars(b).values() if isinstance(v, torch.Tensor)]
    fields += [v for v in b.extras.values() if isinstance(v, torch.Tensor)]
    assert all(out.untyped_storage().data_ptr() != f.untyped_storage().data_ptr()
               for f in fields if f.numel())


def test_every_estimator_is_covered():
    assert len(NAMES) >= 28


@pytest.mark.parametrize("name", NAMES)
def test_compute_into_out_equals_a_fresh_result(name):
    """compute(out=buf) returns buf holding exactly the fresh result (estimators with an
    ``out`` argument write into it, the others are copied)."""
    from sparring.advantages import compute

    b = synthetic_batch(3, 4, 9, 2, 2, seed=5)
    opts = OPTIONS.get(name, {})
    fresh, keep = compute(name, b, **opts)
    buf = torch.full(b.action_mask.shape, float("nan"))
    got, keep2 = compute(name, b, out=buf, **opts)
    assert got.data_ptr() == buf.data_ptr()
    assert torch.equal(got, fresh) and torch.equal(keep, keep2)
    with pytest.raises(ValueError, match="out has shape"):
        compute(name, b, out=torch.empty(1, 1), **opts)


def test_trajectory_estimators_write_into_out_directly():
    writes = {e.name for e in list_estimators() if e.extra.get("writes_out")}
    assert {"grpo", "rloo", "reinforce", "dr_grpo", "mc_grpo", "bnpo", "ngrpo", "a_grae",
            "opo", "reinforce_pp", "reinforce_pp_baseline", "gpg", "remax"} <= writes
