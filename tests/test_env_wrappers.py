from collections import Counter

import pytest

from sparring.envs import make
from sparring.envs.wrappers import (
    RandomOpening,
    TryAgain,
    TurnBudget,
    check_openings,
)

GYM_4X4 = ["SFFF", "FHFH", "FFFH", "HFFG"]


def arithmetic_answer(obs: str) -> int:
    a, op, b = obs.split("\n")[-1].removesuffix(" = ?").split()
    return int(a) + int(b) if op == "+" else int(a) - int(b) if op == "-" else int(a) * int(b)


def test_try_again_discounted():
    env = TryAgain(make("arithmetic"), attempts=3, discount=0.5)
    env.reset(4)
    problem = env.observation(0)
    right = arithmetic_answer(problem)
    res = env.step(str(right + 1))
    assert res.rewards == [0.0] and not res.done and res.info["attempt"] == 1
    obs = env.observation(0)
    assert obs == f"wrong (your answer: {right + 1}). attempts left: 2\n{problem}"
    res = env.step(str(right + 2))
    assert not res.done and "attempts left: 1" in env.observation(0)
    res = env.step(str(right))
    assert res.done and res.rewards == [0.25] and env.returns() == [0.25]  # 1 * 0.5**2
    assert env.current_seat() is None
    with pytest.raises(RuntimeError):
        env.step(str(right))


def test_try_again_first_right_and_all_wrong():
    env = TryAgain(make("arithmetic"), attempts=2)
    env.reset(1)
    right = arithmetic_answer(env.observation(0))
    assert env.step(str(right)).rewards == [1.0]
    env.reset(1)
    assert env.observation(0) == env.env.observation(0)  # no feedback on a fresh episode
    assert not env.step("0").done
    res = env.step("0")
    assert res.done and res.rewards == [0.0] and env.state_key().endswith("attempt2")


def test_try_again_multi_turn_inner():
    env = TryAgain(make("frozen_lake", layout=GYM_4X4), attempts=2)
    env.reset(0)
    env.step("down")
    res = env.step("right")  # a hole: attempt 1 failed, back to the start
    assert not res.done and env.env.state_key() == "0,0"
    assert env.observation(0).startswith("wrong (your answer: right). attempts left: 1\nPFFF")
    for move in ["right", "right", "down", "down", "down"]:
        assert not env.step(move).done
    res = env.step("right")
    assert res.done and res.rewards == [1.0]


def test_try_again_needs_one_seat():
    with pytest.raises(ValueError, match="single-seat"):
        TryAgain(make("signalling"))
    with pytest.raises(ValueError, match="attempts"):
        TryAgain(make("arithmetic"), attempts=0)


def test_turn_budget_truncates():
    env = TurnBudget(make("frozen_lake", layout=GYM_4X4, max_steps=50), 3, show=True)
    env.reset(0)
    assert env.observation(0).endswith("turns left: 3")
    results = [env.step("left") for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].info["truncated"] is True and all(
        "truncated" not in r.info for r in results[:2])
    assert env.current_seat() is None and env.returns() == [0.0]
    with pytest.raises(RuntimeError):
        env.step("left")
    # a terminal end inside the budget is not a truncation
    env = TurnBudget(make("frozen_lake", layout=GYM_4X4), 6)
    env.reset(0)
    for move in ["right", "right", "down", "down", "down"]:
        env.step(move)
    res = env.step("right")
    assert res.done and res.rewards == [1.0] and "truncated" not in res.info


def test_turn_budget_schedules():
    env = TurnBudget(make("arithmetic"), (2, 10, 4))
    assert [env.budget(s) for s in (0, 1, 2, 3, 4, 100, -5)] == [2, 4, 6, 8, 10, 10, 2]
    env.reset(0)
    assert env.max_turns == 2
    env.set_step(3)
    assert env.max_turns == 2  # applies from the next reset
    env.reset(0)
    assert env.max_turns == 8
    env = TurnBudget(make("arithmetic"), lambda s: 1 + s // 10)
    env.set_step(25)
    env.reset(0)
    assert env.max_turns == 3
    down = TurnBudget(make("arithmetic"), (10, 4, 3))
    assert [down.budget(s) for s in range(4)] == [10, 8, 6, 4]
    for bad in ((1, 2), (1, 2, 0), "5", 0):
        with pytest.raises(ValueError, match="TurnBudget"):
            TurnBudget(make("arithmetic"), bad)


def test_random_opening_is_drawn_from_the_seed_and_never_ends_the_game():
    counts = [0] * 10
    for seed in range(400):
        env = RandomOpening(make("tictactoe"), 9)
        env.reset(seed)
        n = len(env.opening)
        counts[n] += 1
        board = env.state_key()
        assert sum(c != "." for c in board) == n  # the moves are on the board
        assert env.current_seat() == n % 2  # and the game goes on, the right seat to move
        again = RandomOpening(make("tictactoe"), 9)
        again.reset(seed)
        assert again.opening == env.opening
    # n uniform in 0..9 unless the game would end: 0..4 moves can never end it (no line of
    # three before the fifth move), so each of those counts is about 400 / 10
    assert all(20 <= c <= 65 for c in counts[:5])
    assert sum(counts) == 400


def test_random_opening_stops_when_every_move_would_end_the_game():
    env = RandomOpening(make("nim", heaps=[2]), 5)
    seen = set()
    for seed in range(30):
        env.reset(seed)
        # from 2 stones "1:2" ends the game, "1:1" does not; from 1 stone every move ends it
        assert env.opening in ([], ["1:1"]) and env.current_seat() is not None
        seen.add(tuple(env.opening))
    assert seen == {(), ("1:1",)}  # n = 0 (1 in 6) and n >= 1, cut to one move


def test_random_opening_needs_clone():
    with pytest.raises(ValueError, match="no clone"):
        RandomOpening(make("arithmetic"), 2)
    with pytest.raises(ValueError, match="max_moves"):
        RandomOpening(make("tictactoe"), -1)


def test_listed_openings_are_drawn_from_the_seed_with_their_share():
    """``listed``: with share 1 every reset starts after one of the listed move sequences
    (each drawn about equally often), with share 0 none does, in between about that share
    of the seeds (the rest take the random opening); the same seed, the same opening."""
    listed = [("5", "1"), ("1", "2", "3")]
    boards = {("5", "1"): "O...X....", ("1", "2", "3"): "XOX......"}
    env = RandomOpening(make("tictactoe"), 0, listed, listed_share=1.0)
    drawn = Counter()
    for seed in range(200):
        env.reset(seed)
        drawn[tuple(env.opening)] += 1
        assert env.state_key() == boards[tuple(env.opening)]
        assert env.current_seat() == len(env.opening) % 2
    assert set(drawn) == set(listed) and min(drawn.values()) > 70
    never = RandomOpening(make("tictactoe"), 2, listed, listed_share=0.0)
    half = RandomOpening(make("tictactoe"), 0, listed, listed_share=0.5)
    n_listed = 0
    for seed in range(400):
        never.reset(seed)
        plain = RandomOpening(make("tictactoe"), 2)
        plain.reset(seed)
        assert never.opening == plain.opening  # the random opening's stream is unchanged
        half.reset(seed)
        n_listed += bool(half.opening)
    assert 160 <= n_listed <= 240  # 200 expected, binomial sd 10
    again = RandomOpening(make("tictactoe"), 0, listed, listed_share=0.5)
    for seed in range(20):
        half.reset(seed), again.reset(seed)
        assert half.opening == again.opening


def test_a_listed_opening_that_is_illegal_or_ends_the_game_is_named():
    with pytest.raises(ValueError, match=r"opening 2: move 2 \('5'\) is not legal after '5'"):
        check_openings(make("tictactoe"), [("1",), ("5", "5")])
    with pytest.raises(ValueError, match=r"opening 1: move 5 \('3'\) after '1 4 2 5' ends the game"):
        check_openings(make("tictactoe"), [("1", "4", "2", "5", "3")])
    with pytest.raises(ValueError, match=r"listed opening: move 2 \('5'\) is not legal after '5'"):
        RandomOpening(make("tictactoe"), 0, [("5", "5")]).reset(0)  # unchecked: reset says so
    with pytest.raises(ValueError, match="listed_share"):
        RandomOpening(make("tictactoe"), 0, [("1",)], listed_share=1.5)
