"""The rollout schedule of a run (sparring.rollout.schedule): episode counts, opponents,
seat rotation, determinism per step."""

from pathlib import Path

import pytest

from sparring.rollout.schedule import episode_counts
from sparring.rollout.seating import learner_seat, rotating
from sparring.train.config import load_config
from sparring.train.setup import build

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


def test_rotation_puts_the_learner_in_every_seat_in_turn():
    draws = iter(range(100))
    choose = rotating("me", lambda: next(draws), 3)
    assert [choose(i) for i in range(4)] == [["me", 0, 1], [2, "me", 3], [4, 5, "me"],
                                             ["me", 6, 7]]
    assert [learner_seat(i, 3) for i in range(4)] == [0, 1, 2, 0]


def test_rollouts_mix_self_play_bots_and_the_pool(tmp_path):
    cfg = _cfg(["rollout.pool_every=1"])
    roll = build(cfg, tmp_path).rollout_fn
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
    a = build(_cfg(), tmp_path / "a").rollout_fn
    b = build(_cfg(), tmp_path / "b").rollout_fn
    a(0)  # a different step in between must not change step 3's rollouts
    ea, eb = a(3), b(3)
    assert [[t.action_ids for t in e.turns] for e in ea] == \
        [[t.action_ids for t in e.turns] for e in eb]


def test_an_alias_plays_exactly_as_the_canonical_name(tmp_path):
    a = build(_cfg(), tmp_path / "a").rollout_fn
    b = build(_cfg(["envs.0.name=tic_tac_toe"]), tmp_path / "b").rollout_fn
    ea, eb = a(2), b(2)
    assert {e.env for e in eb} == {"tictactoe"}
    assert [[t.action_ids for t in e.turns] for e in ea] == \
        [[t.action_ids for t in e.turns] for e in eb]


def test_unknown_opponent_is_a_clear_error(tmp_path):
    cfg = _cfg(["envs.0.opponents=[self,bogus]"])
    with pytest.raises(ValueError, match="bogus.*allowed: self, pool, .*random"):
        build(cfg, tmp_path)
