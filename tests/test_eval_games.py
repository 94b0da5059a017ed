"""A model policy against bots and its exact exploitability (sparring.eval.games), and a
training run's periodic evaluation (sparring.eval.periodic)."""

from pathlib import Path

import pytest
import torch

from sparring.envs import make
from sparring.eval.exploitability import exploitability
from sparring.eval.games import action_probabilities, policy_exploitability
from sparring.eval.periodic import env_options
from sparring.policy.sampling import SamplingParams
from sparring.train.config import load_config
from sparring.train.setup import build

CONFIGS = Path(__file__).parents[1] / "configs"
TINY = ["model.options.hidden_size=32", "model.options.num_layers=1",
        "model.options.intermediate_size=64", "model.options.num_heads=2",
        "model.options.num_kv_heads=2"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cfg(overrides=(), recipe="default"):
    return load_config(CONFIGS / f"{recipe}.yaml", [*TINY, "rollout.episodes_per_step=24",
                                                    "envs.0.group_size=4", *overrides])


def test_action_probabilities_match_the_constrained_sampler(tmp_path):
    policy = build(_cfg(), tmp_path).policy
    env = make("kuhn_poker")
    env.reset(0)
    prompt = policy.tokenizer.encode(env.observation(0), add_special_tokens=False)
    legal = env.legal_actions(0)
    probs = action_probabilities(policy, [prompt], [legal])[0]
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-5)
    gens = policy.generate([prompt] * 4, SamplingParams(max_new_tokens=8), allowed=[legal] * 4)
    for g in gens:  # the generation's own log-probs: an independent code path
        act = g.text.replace(policy.tokenizer.eos_token, "")
        assert probs[act] == pytest.approx(float(torch.tensor(g.logprobs).sum().exp()), rel=1e-4)


def test_policy_exploitability_of_the_model_equals_the_table_it_implies(tmp_path):
    parts = build(_cfg(), tmp_path)
    arena, policy = parts.rollout_fn.arena, parts.policy
    value = policy_exploitability(arena, policy, "kuhn_poker", {})
    # a policy that ignores its card is exploitable; exploitability is within [0, 2] chips
    assert 0.0 < value < 2.0
    assert value != pytest.approx(exploitability("kuhn_poker", lambda s, a: {x: 1 / len(a) for x in a}))


def test_eval_reports_rates_with_intervals(tmp_path):
    cfg = _cfg(["eval.games=12"])
    out = build(cfg, tmp_path).eval_fn(0, None)
    p = "tictactoe/random/"
    assert out[p + "win"] + out[p + "draw"] + out[p + "loss"] == pytest.approx(1.0)
    assert out[p + "non_loss"] == pytest.approx(out[p + "win"] + out[p + "draw"])
    assert out[p + "non_loss_lo"] <= out[p + "non_loss"] <= out[p + "non_loss_hi"]
    assert out[p + "games"] == 12 and out[p + "invalid_rate"] == 0.0


def test_eval_scores_exploitability_where_the_env_declares_a_tree(tmp_path):
    cfg = _cfg(["eval.games=2", "envs.0.name=leduc_poker", "envs.0.options={compact: true}"])
    out = build(cfg, tmp_path).eval_fn(0, None)
    assert 0.0 < out["leduc/exploitability"] < 14.0  # keys use the canonical name
    assert "leduc/exploitability_average" not in out  # no learner, no magnet
    tic = build(_cfg(["eval.games=2"]), tmp_path / "t").eval_fn(0, None)
    assert not any("exploitability" in k for k in tic)


def test_env_options_find_a_spec_by_name_or_alias():
    cfg = _cfg(["envs.0.name=tic_tac_toe", "envs.0.options={compact: true}"])
    assert env_options(cfg, "tictactoe") == env_options(cfg, "tic_tac_toe") == {"compact": True}
    assert env_options(cfg, "leduc") == {}


def test_unknown_eval_opponent_is_a_build_error(tmp_path):
    with pytest.raises(ValueError, match="eval.opponents: unknown 'bogus'.*allowed: .*random"):
        build(_cfg(["eval.opponents=[random,bogus]"]), tmp_path)
