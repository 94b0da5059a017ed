"""The Gymnasium adapter against our own FrozenLake (same maps, same action sequences: same
rewards, termination and truncation), free-text actions, and the errors."""

import random
import sys

import numpy as np
import pytest

from sparring.envs import make
from sparring.envs.tasks.frozen_lake import FrozenLake, random_map

gym = pytest.importorskip("gymnasium", reason="needs the 'gymnasium' extra: "
                          "pip install 'sparring[gymnasium]'")

GYM_ACTIONS = ["left", "down", "right", "up"]  # Gymnasium's FrozenLake: 0 1 2 3


def _lake(layout, max_steps):
    return make("gymnasium", env="FrozenLake-v1", obs_to_text=lambda s: f"cell {s}",
                action_to_text=GYM_ACTIONS,
                env_kwargs={"desc": layout, "is_slippery": False, "max_episode_steps": max_steps})


def test_frozen_lake_matches_ours_on_random_maps():
    ends = {"goal": 0, "hole": 0, "truncated": 0}
    for g in range(200):
        rng = random.Random(g)
        size = rng.choice([3, 4, 5])
        layout = random_map(size, 0.75, rng)
        max_steps = rng.choice([6, 12, 20])
        ad, ours = _lake(layout, max_steps), FrozenLake(layout=layout, max_steps=max_steps)
        ad.reset(g)
        ours.reset(g)
        while ours.current_seat() is not None:
            assert ad.current_seat() == 0
            assert sorted(ad.legal_actions(0)) == sorted(ours.legal_actions(0))
            move = rng.choice(GYM_ACTIONS)
            r1, r2 = ad.step(move), ours.step(move)
            assert r1.rewards == r2.rewards and r1.done == r2.done
            assert r1.info.get("truncated", False) == r2.info.get("truncated", False)
            assert ad.state_key() == str(ours.pos[0] * size + ours.pos[1])  # Gymnasium's cell
        assert ad.current_seat() is None and ad.returns() == ours.returns()
        cell = layout[ours.pos[0]][ours.pos[1]]
        ends["goal" if cell == "G" else "hole" if cell == "H" else "truncated"] += 1
    assert min(ends.values()) > 0, ends  # every way an episode ends was compared


def test_views_parsing_and_an_env_object():
    env = make("gymnasium", env=gym.make("FrozenLake-v1", is_slippery=False),
               obs_to_text=lambda s: f"cell {s}", action_to_text=GYM_ACTIONS)
    assert env.name == "gymnasium:FrozenLake-v1" and env.num_seats == 1
    assert env.observation(0) == "cell 0\nLegal: left | down | right | up"
    assert env.parse(0, "go <answer>down</answer>").action == "down"
    assert env.parse(0, "fly").status == "unparsable"
    assert env.step("right").rewards == [0.0] and env.state_key() == "1"
    with pytest.raises(ValueError, match="illegal action 'jump'"):
        env.step("jump")
    for move in ("right", "down", "down", "down", "right"):  # the default 4x4 map's safe path
        res = env.step(move)
    assert res.done and res.rewards == [1.0] and env.current_seat() is None
    assert env.observation(0).endswith("Episode over: return +1.")
    assert env.legal_actions(0) == []


class Guess(gym.Env):
    """Say a number in [0, 10]; reward -|x - 7|; one step."""

    action_space = gym.spaces.Box(0.0, 10.0, shape=(), dtype=np.float32)
    observation_space = gym.spaces.Discrete(1)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, action):
        return 0, -abs(float(action) - 7.0), True, False, {}


def test_free_text_actions_through_text_to_action():
    env = make("gymnasium", env=Guess(), obs_to_text=lambda _: "Guess a number in [0, 10].",
               text_to_action=lambda t: np.array(float(t), dtype=np.float32))
    assert env.legal_actions(0) is None
    assert env.observation(0) == "Guess a number in [0, 10]."
    assert env.parse(0, "<answer>6.5</answer>").action == "6.5"
    assert env.parse(0, "<answer>many</answer>").status == "unparsable"
    assert env.parse(0, "<answer>50</answer>").status == "illegal"
    res = env.step("6.5")
    assert res.done and res.rewards == [-0.5]


def test_errors_name_the_problem(monkeypatch):
    with pytest.raises(ValueError, match="not Discrete: give text_to_action"):
        make("gymnasium", env=Guess(), obs_to_text=str)
    with pytest.raises(ValueError, match="cannot make 'NoSuchEnv-v0'"):
        make("gymnasium", env="NoSuchEnv-v0", obs_to_text=str)
    with pytest.raises(ValueError, match="give obs_to_text"):
        make("gymnasium", env="FrozenLake-v1")
    with pytest.raises(ValueError, match="names repeat"):
        make("gymnasium", env="FrozenLake-v1", obs_to_text=str, action_to_text=["a"] * 4)
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    with pytest.raises(ImportError, match=r"'gymnasium' extra: pip install 'sparring\[gymnasium\]'"):
        _lake(["SG"], 5)
