"""AdvantageStage: one rule for per-environment options, what it needs from the learner,
the estimator state it owns, and no estimator/objective names special-cased elsewhere."""

import math
import re
from pathlib import Path

import pytest
import torch

from sparring.advantages import ESTIMATORS
from sparring.advantages.stage import AdvantageStage
from sparring.config import from_dict
from sparring.data import Episode, Turn, collate
from sparring.objectives import OBJECTIVES
from sparring.train.policies import advantage_stage

SRC = Path(__file__).parents[1] / "src" / "sparring"


def _two_env_batch():
    """Four one-turn trajectories: two in tictactoe (returns 1, 0), two in nim (0.5, 3)."""
    eps = []
    for k, (env, ret) in enumerate([("tictactoe", 1.0), ("tictactoe", 0.0), ("nim", 0.5),
                                    ("nim", 3.0)]):
        t = Turn(agent=0, prompt_ids=[1], action_ids=[2], logprobs=[-0.5], reward=ret)
        eps.append(Episode(env=env, seed=k, group=k, num_agents=1, turns=[t], returns=[ret]))
    return collate(eps)


def _stage(nim_eps):
    cfg = from_dict({"algorithm": {"estimator": "reinforce_pp"},
                     "envs": [{"name": "tictactoe"},
                              {"name": "nim", "estimator_options": {"eps": nim_eps}}]})
    return advantage_stage(cfg)


def test_per_env_rule_does_not_depend_on_option_values():
    """Statistics are always per environment, whether the per-env options are equal or
    not: equal options do not pool the whole batch (batch whitening over all four
    returns)."""
    b = _two_env_batch()
    same, _ = _stage(1e-6)(b)
    other, _ = _stage(1.0000001e-6)(b)
    # whitening two values with the unbiased std gives +-1/sqrt(2) in each env
    s = 1 / math.sqrt(2)
    assert same.sum(1).tolist() == pytest.approx([s, -s, -s, s], abs=1e-5)
    assert other.sum(1).tolist() == pytest.approx(same.sum(1).tolist(), abs=1e-9)
    # the pooled numbers (mean 1.125, std over all 4), which equal options must not give
    pooled = [(r - 1.125) / (math.sqrt(sum((x - 1.125) ** 2 for x in (1, 0, .5, 3)) / 3))
              for r in (1, 0, .5, 3)]
    assert same.sum(1).tolist() != pytest.approx(pooled, abs=1e-3)


def test_env_options_override_global_options_per_env():
    b = _two_env_batch()
    stage = AdvantageStage("grpo", {"scale": False},
                           env_options={"nim": {"scale": True}})
    adv, keep = stage(b)
    # each episode is its own group: a group of one gets 0 either way
    assert adv.abs().sum() == 0 and keep.all()
    b2 = b.with_fields(group=torch.tensor([0, 0, 1, 1]))
    adv, _ = stage(b2)
    # tictactoe: R - mean = +-0.5 (no scaling); nim: (R - 1.75) / (std 1.7678 + 1e-6)
    sd = math.sqrt(2 * 1.25 ** 2)
    assert adv.sum(1).tolist() == pytest.approx([0.5, -0.5, -1.25 / (sd + 1e-6),
                                               1.25 / (sd + 1e-6)], abs=1e-5)


def test_needs_come_from_the_registry():
    assert AdvantageStage("gae").needs == {"values"}
    assert AdvantageStage("turn_gae").needs == {"values"}
    assert AdvantageStage("archer_targets").needs == {"utterance_critic"}
    assert AdvantageStage("grpo").needs == frozenset()
    stage = AdvantageStage("rloo", shaping=["kl_in_reward", "canon", "ucas"])
    assert stage.needs == {"ref_logp", "entropies"}


def test_stage_owns_and_checkpoints_estimator_state():
    b = _two_env_batch()
    stage = AdvantageStage("role_ema", {"decay": 0.5, "init": 0.0})
    assert stage.state is not None
    adv1, _ = stage(b)
    # first call: baseline 0 -> A = R; then b <- 0.5 * 0 + 0.5 * mean_env R
    assert adv1.sum(1).tolist() == pytest.approx([1.0, 0.0, 0.5, 3.0])
    saved = stage.state_dict()
    fresh = AdvantageStage("role_ema", {"decay": 0.5, "init": 0.0})
    fresh.load_state_dict(saved)
    adv2, _ = fresh(b)
    # baselines 0.25 (tictactoe seat 0: mean 0.5) and 0.875 (nim: mean 1.75)
    assert adv2.sum(1).tolist() == pytest.approx([0.75, -0.25, -0.375, 2.125])
    assert stage(b)[0].tolist() == adv2.tolist()
    with pytest.raises(ValueError, match="does not fit"):
        AdvantageStage("grpo").load_state_dict(saved)
    assert AdvantageStage("grpo").state_dict() == {}


def test_unknown_names_and_options_are_named():
    with pytest.raises(KeyError, match="unknown estimator 'grpoo'"):
        AdvantageStage("grpoo")
    with pytest.raises(ValueError, match="no option 'scal'"):
        AdvantageStage("grpo", {"scal": True})


def _names():
    return sorted({e.name for e in ESTIMATORS} | {e.name for e in OBJECTIVES}, key=len)


def test_no_estimator_or_objective_name_is_compared_outside_its_registry():
    """Names are compared only inside advantages/ and objectives/ (DESIGN.md)."""
    alt = "|".join(re.escape(n) for n in _names())
    q = rf"""["'](?:{alt})["']"""
    pattern = re.compile(rf"(?:==|!=)\s*{q}|{q}\s*(?:==|!=)|\bin\s*[(\[{{][^)\]}}]*{q}")
    offenders = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(("advantages/", "objectives/")):
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{rel}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_env_options_follow_an_openspiel_alias_to_the_canonical_name():
    cfg = from_dict({"algorithm": {"estimator": "grpo"},
                     "envs": [{"name": "tic_tac_toe", "estimator_options": {"scale": False}}]})
    stage = advantage_stage(cfg)
    assert stage.env_options == {"tictactoe": {"scale": False}}
    b = _two_env_batch().with_fields(group=torch.tensor([0, 0, 1, 1]))
    adv, _ = stage(b)
    assert adv[:2].sum(1).tolist() == pytest.approx([0.5, -0.5])  # not scaled: R - mean
