"""The contract every registered estimator keeps (checked on the raw function, because
`compute` relies on it): shape [n, T], finite, exactly zero outside the action mask, its
own storage (no view of a batch field), on multi-turn, multi-agent batches with prompts,
padding, truncated episodes and every optional field present."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparring.advantages import ESTIMATORS, compute, list_estimators
from tests.turn_batches import random_batch

NAMES = [e.name for e in list_estimators()]


def run(name, b):
    entry = ESTIMATORS.get(name)
    state = entry.extra.get("state")
    opts = {"state": state()} if state is not None else {}
    return entry.fn(b, **opts)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=8, deadline=None)
@given(episodes=st.integers(1, 8), agents=st.integers(1, 3), max_turns=st.integers(1, 4),
       groups=st.integers(1, 3), seed=st.integers(0, 10_000))
def test_raw_estimator_is_finite_and_zero_outside_the_mask(name, episodes, agents, max_turns,
                                                           groups, seed):
    layout = ESTIMATORS.get(name).layout
    b = random_batch(seed, episodes, agents, max_turns, groups,
                     layout="trajectory" if layout == "trajectory" else "turn")
    out = run(name, b)
    assert out.shape == b.action_mask.shape
    assert torch.isfinite(out).all()
    assert (out[~b.action_mask] == 0).all()
    # the result is the caller's to overwrite (advantage shapers may write into it)
    fields = [v for v in vars(b).values() if isinstance(v, torch.Tensor)]
    fields += [v for v in b.extras.values() if isinstance(v, torch.Tensor)]
    assert all(out.untyped_storage().data_ptr() != f.untyped_storage().data_ptr()
               for f in fields if f.numel())


def test_the_catalogue_is_registered():
    """Every estimator of docs/estimators.md, and nothing else (shapers live in SHAPERS)."""
    assert set(NAMES) == {
        "reinforce", "rloo", "grpo", "dr_grpo", "mc_grpo", "bnpo", "ngrpo", "a_grae", "opo",
        "reinforce_pp", "reinforce_pp_baseline", "gpg", "remax",
        "turn_rtg", "trloo", "gigpo", "role_ema", "gated", "igpo", "matchtir",
        "gae", "turn_gae", "archer_targets"}


@pytest.mark.parametrize("name", [n for n in NAMES if ESTIMATORS.get(n).layout != "turn"])
def test_trajectory_layout_estimators_run_on_trajectory_batches(name):
    b = random_batch(3, layout="trajectory")
    adv, keep = compute(name, b)
    assert adv.shape == b.action_mask.shape and keep.shape == (b.n_rows,)
    assert torch.isfinite(adv).all() and (adv[~b.action_mask] == 0).all()
