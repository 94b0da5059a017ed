from collections import Counter, deque

import pytest

from sparring.envs import make

GYM_4X4 = ["SFFF", "FHFH", "FFFH", "HFFG"]
STEP = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def grid_of(obs: str) -> list[str]:
    return obs.split("\n")[:-1]


def test_hand_checked_path():
    env = make("frozen_lake", layout=GYM_4X4)
    env.reset(0)
    assert env.observation(0) == "PFFF\nFHFH\nFFFH\nHFFG\nsteps left: 20"
    res = env.step("left")  # off the grid: stay
    assert env.state_key() == "0,0" and res.rewards == [0.0] and not res.done
    for move, key in [("right", "0,1"), ("right", "0,2"), ("down", "1,2"), ("down", "2,2"),
                      ("down", "3,2")]:
        res = env.step(move)
        assert env.state_key() == key and res.rewards == [0.0] and not res.done
    res = env.step("right")
    assert res.done and res.rewards == [1.0] and "truncated" not in res.info
    assert env.returns() == [1.0] and env.current_seat() is None


def test_hole_ends_without_reward():
    env = make("frozen_lake", layout=GYM_4X4)
    env.reset(0)
    env.step("down")
    res = env.step("right")  # (1,1) is a hole
    assert res.done and res.rewards == [0.0] and "truncated" not in res.info


def test_truncation():
    env = make("frozen_lake", layout=GYM_4X4, max_steps=3)
    env.reset(0)
    results = [env.step("left") for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].info["truncated"] is True and env.returns() == [0.0]
    with pytest.raises(RuntimeError):
        env.step("left")


def test_slippery_distribution():
    # from (1,1) of an all-frozen 3x3 lake, "right" lands on (1,2) w.p. 1/3,
    # on (0,1) (slipped up) w.p. 1/3 and (2,1) (slipped down) w.p. 1/3.
    env = make("frozen_lake", layout=["FFF", "FSF", "FFG"], slippery=True)
    counts = Counter()
    n = 3000
    for seed in range(n):
        env.reset(seed)
        env.step("right")
        counts[env.state_key()] += 1
    assert set(counts) == {"1,2", "0,1", "2,1"}
    for key in counts:
        assert abs(counts[key] - n / 3) < 120  # about 4.6 standard deviations


def bfs_reachable(grid):
    n = len(grid)
    seen, todo = {(0, 0)}, deque([(0, 0)])
    while todo:
        r, c = todo.popleft()
        if (r, c) == (n - 1, n - 1):
            return True
        for dr, dc in STEP.values():
            q = (r + dr, c + dc)
            if 0 <= q[0] < n and 0 <= q[1] < n and q not in seen and grid[q[0]][q[1]] != "H":
                seen.add(q)
                todo.append(q)
    return False


@pytest.mark.parametrize("size", [4, 6])
def test_random_maps_solvable_and_deterministic(size):
    env, other = make("frozen_lake", size=size, p_frozen=0.7), make("frozen_lake", size=size,
                                                                      p_frozen=0.7)
    maps = set()
    for seed in range(100):
        env.reset(seed)
        other.reset(seed)
        assert env.observation(0) == other.observation(0)
        grid = grid_of(env.observation(0))
        assert grid[0][0] == "P" and grid[-1][-1] == "G" and len(grid) == size
        maps.add(tuple(grid))
        assert bfs_reachable(["S" + grid[0][1:]] + grid[1:])
    assert len(maps) > 50


def test_parse_and_options():
    env = make("frozen_lake")
    assert env.legal_actions(0) == ["up", "down", "left", "right"]
    assert env.parse(0, "I go Down, no, <answer>left</answer>").action == "left"
    assert env.parse(0, "up then right").action == "right"
    assert env.parse(0, "north").status == "unparsable"
    with pytest.raises(ValueError):
        env.step("north")
    for opts in ({"size": 1}, {"p_frozen": 0}, {"max_steps": 0}, {"layout": ["SX", "FG"]},
                 {"layout": ["SF", "F"]}):
        with pytest.raises(ValueError, match="frozen_lake"):
            make("frozen_lake", **opts)


def test_impossible_map_is_an_error():
    with pytest.raises(ValueError, match="raise p_frozen"):
        make("frozen_lake", size=12, p_frozen=0.05)
