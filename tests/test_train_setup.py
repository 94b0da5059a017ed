"""The wiring of configs into rollouts, opponents and evaluation (sparring.train.setup)."""

from pathlib import Path

import pytest
import torch

from sparring.envs import make
from sparring.eval.exploitability import exploitability
from sparring.policy.sampling import SamplingParams
from sparring.train.config import load_config
from sparring.train.eval_games import action_probabilities, policy_exploitability
from sparring.train.setup import build, episode_counts

CONFIGS = Path(__file__).parents[1] / "configs"
TINY = ["model.options.hidden_size=32", "model.options.num_layers=1",
        "model.options.intermediate_size=64", "model.options.num_heads=2",
        "model.options.num_kv_heads=2"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cfg(overrides=()):
    return load_config(CONFIGS / "default.yaml", [*TINY, "rollout.episodes_per_step=24",
                                                  "envs.0.group_size=4", *overrides])


def test_episode_counts_follow_weights_in_whole_groups():
    cfg = load_config(CONFIGS / "mixed_games.yaml", ["rollout.episodes_per_step=64"])
    # weights 2:1:1 of 64 episodes, group size 16 -> 32, 16, 16
    assert episode_counts(cfg) == [32, 16, 16]


def test_rollouts_mix_self_play_bots_and_the_pool(tmp_path):
    cfg = _cfg(["rollout.pool_every=1"])
    parts = build(cfg, tmp_path)
    roll = parts["rollout_fn"]
    eps = roll(1)  # step 1 adds the first snapshot to the pool
    assert len(eps) == 24
    kinds = [tuple(ep.info["players"]) for ep in eps]
    selfplay = [k for k in kinds if k == ("learner", "learner")]
    vs_random = [k for k in kinds if "random" in k]
    assert len(selfplay) == 8 and len(vs_random) >= 8
    assert (tmp_path / "pool" / "step-000001" / "tokenizer_config.json").exists()
    assert [c["step"] for c in roll.state_dict()["pool"]["checkpoints"]] == [1]
    # the learner's seat rotates against bots: both seats are played
    seats = {k.index("learner") for k in kinds if "random" in k}
    assert seats == {0, 1}
    groups = {ep.group for ep in eps}
    assert len(groups) == 6  # 24 episodes / group size 4, unique across opponent kinds


def test_rollouts_repeat_exactly_for_the_same_step(tmp_path):
    a = build(_cfg(), tmp_path / "a")["rollout_fn"]
    b = build(_cfg(), tmp_path / "b")["rollout_fn"]
    a(0)  # a different step in between must not change step 3's rollouts
    ea, eb = a(3), b(3)
    assert [[t.action_ids for t in e.turns] for e in ea] == \
        [[t.action_ids for t in e.turns] for e in eb]


def test_action_probabilities_match_the_constrained_sampler(tmp_path):
    parts = build(_cfg(), tmp_path)
    policy = parts["policy"]
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
    arena, policy = parts["rollout_fn"].arena, parts["policy"]
    value = policy_exploitability(arena, policy, "kuhn_poker", {})
    # a policy that ignores its card is exploitable; exploitability is within [0, 2] chips
    assert 0.0 < value < 2.0
    assert value != pytest.approx(exploitability("kuhn_poker", lambda s, a: {x: 1 / len(a) for x in a}))


def test_eval_reports_rates_with_intervals(tmp_path):
    cfg = _cfg(["eval.games=12"])
    out = build(cfg, tmp_path)["eval_fn"](0)
    p = "tictactoe/random/"
    assert out[p + "win"] + out[p + "draw"] + out[p + "loss"] == pytest.approx(1.0)
    assert out[p + "non_loss"] == pytest.approx(out[p + "win"] + out[p + "draw"])
    assert out[p + "non_loss_lo"] <= out[p + "non_loss"] <= out[p + "non_loss_hi"]
    assert out[p + "games"] == 12 and out[p + "invalid_rate"] == 0.0


def test_unknown_opponent_is_a_clear_error(tmp_path):
    cfg = _cfg(["envs.0.opponents=[self,bogus]"])
    with pytest.raises(ValueError, match="bogus.*allowed: self, pool, random"):
        build(cfg, tmp_path)


def test_role_ema_keeps_its_baselines_across_steps_and_in_checkpoints(tmp_path):
    import json

    from sparring.train.loop import train

    cfg = _cfg(["algorithm.estimator=role_ema", "algorithm.estimator_options={decay: 0.5}",
                "train.steps=2", "train.epochs=1", "eval.every=0", "eval.at_start=false",
                "checkpoint.every=1", "logging.progress=false"])
    parts = build(cfg, tmp_path)
    tracker = parts["stateful"]["estimator"].tracker
    seen = []
    roll = parts["rollout_fn"]

    def rollout(step):  # record each step's episodes to recompute the EMA by hand
        eps = roll(step)
        seen.append(eps)
        return eps

    train(cfg, parts["model"], rollout, None, parts["stateful"], run_dir=tmp_path,
          pad_id=parts["pad_id"])
    # b <- 0.5 b + 0.5 mean(R) per (env, seat), from b = 0, over the learner's trajectories
    want = {}
    for eps in seen:
        for seat in (0, 1):
            rs = [e.returns[seat] for e in eps if e.info["players"][seat] == "learner"]
            key = f"tictactoe/{seat}"
            want[key] = 0.5 * want.get(key, 0.0) + 0.5 * sum(rs) / len(rs)
    assert tracker.baselines.keys() == want.keys()
    for k in want:
        assert tracker.baselines[k] == pytest.approx(want[k], abs=1e-6)
    state = json.loads((tmp_path / "checkpoints" / "step_000002" / "state.json").read_text())
    assert "user.estimator" in json.dumps(state)
