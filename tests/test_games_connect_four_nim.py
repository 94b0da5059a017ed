"""Connect Four and Nim rules by hand, MCTS tactics, Nim minimax against Bouton's theorem."""

import functools
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparring.envs import make
from sparring.envs.bots import MCTSBot, MinimaxBot, RandomBot, minimax_value


def play(env, moves):
    for m in moves:
        res = env.step(m)
    return res


def test_connect_four_wins():
    env = make("connect_four")
    res = play(env, ["1", "2", "1", "2", "1", "2", "1"])  # vertical X in column 1
    assert res.done and env.returns() == [1.0, -1.0]
    env.reset(0)
    res = play(env, ["7", "1", "7", "2", "6", "3", "6", "4"])  # O: 1 2 3 4 bottom row
    assert res.done and env.returns() == [-1.0, 1.0]
    env.reset(0)
    # X diagonal 1,2,3,4 rising: X at (1,0) (2,1) (3,2) (4,3)
    res = play(env, ["1", "2", "2", "3", "3", "4", "3", "4", "4", "7", "4"])
    assert res.done and env.returns() == [1.0, -1.0]


def test_connect_four_board_legal_errors():
    env = make("connect_four")
    play(env, ["4", "4"])
    assert env.observation(0) == (".......\n" * 4 + "...O...\n...X...\n1234567\n"
                                  "You are X. Legal: 1 2 3 4 5 6 7")
    play(env, ["4", "4", "4", "4"])
    assert env.legal_actions(0) == ["1", "2", "3", "5", "6", "7"]
    with pytest.raises(ValueError, match="illegal action '4'"):
        env.step("4")
    assert env.parse(0, "<answer>4</answer>").status == "illegal"
    assert env.parse(0, "column 5").action == "5"


def test_mcts_takes_win_and_blocks():
    env = make("connect_four")
    play(env, ["1", "2", "1", "2", "1", "3"])  # X to move, three in column 1
    assert MCTSBot(200, seed=0).act(env, 0) == "1"
    env.reset(0)
    play(env, ["1", "2", "1", "2", "1"])  # O to move must block column 1
    assert MCTSBot(300, seed=1).act(env, 1) == "1"
    with pytest.raises(ValueError, match="simulations"):
        MCTSBot(0)


@pytest.mark.parametrize("n", [10, pytest.param(40, marks=pytest.mark.slow)])
def test_mcts_beats_random_connect_four(n):
    env = make("connect_four")
    wins = 0
    for g in range(n):
        env.reset(g)
        m, r = MCTSBot(100, seed=g), RandomBot(g)
        while (s := env.current_seat()) is not None:
            env.step((m if s == g % 2 else r).act(env, s))
        wins += env.returns()[g % 2] == 1.0
    assert wins >= 0.9 * n


def test_nim_rules():
    env = make("nim", heaps=[2, 1])
    assert env.legal_actions(0) == ["1:1", "1:2", "2:1"]
    res = play(env, ["1:2", "2:1"])  # seat 1 takes the last stone
    assert res.done and env.returns() == [-1.0, 1.0]
    mis = make("nim", heaps=[2, 1], misere=True)
    play(mis, ["1:2", "2:1"])
    assert mis.returns() == [1.0, -1.0]
    with pytest.raises(ValueError, match="illegal action '1:3'"):
        make("nim").step("1:3")
    with pytest.raises(ValueError, match="heaps"):
        make("nim", heaps=[0, 0])
    assert env.parse(0, "take 2:1") .status == "illegal"  # game over: nothing is legal
    fresh = make("nim")
    assert fresh.parse(0, "I take <answer>4:7</answer>").action == "4:7"
    assert fresh.parse(0, "14:7").status == "unparsable"


@functools.cache
def _wins_to_move(heaps: tuple, misere: bool) -> bool:
    """Brute force: does the player to move win from these heaps?"""
    if sum(heaps) == 0:
        return misere  # the previous player took the last stone
    for i, h in enumerate(heaps):
        for k in range(1, h + 1):
            nxt = tuple(sorted(heaps[:i] + (h - k,) + heaps[i + 1:]))
            if not _wins_to_move(nxt, misere):
                return True
    return False


@pytest.mark.parametrize("misere", [False, True])
def test_nim_minimax_matches_theory(misere):
    for heaps in itertools.product(range(4), range(4), range(5)):
        if sum(heaps) == 0:
            continue
        env = make("nim", heaps=list(heaps), misere=misere)
        v = minimax_value(env)  # seat 0 to move
        x = heaps[0] ^ heaps[1] ^ heaps[2]
        if not misere:
            assert (v == 1.0) == (x != 0), heaps  # Bouton
        else:
            big = any(h > 1 for h in heaps)
            assert (v == 1.0) == ((x != 0) if big else (x == 0)), heaps
        assert (v == 1.0) == _wins_to_move(tuple(sorted(heaps)), misere)


def test_nim_minimax_bot_wins_won_positions():
    env = make("nim")  # 1^3^5^7 = 0: the first player loses against perfect play
    for g in range(50):
        env.reset(g)
        bots = (RandomBot(g), MinimaxBot(g))
        while (s := env.current_seat()) is not None:
            env.step(bots[s].act(env, s))
        assert env.returns() == [-1.0, 1.0]


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(), st.binary(), st.text(alphabet="0123456789: <>answer", max_size=40)))
def test_parse_fuzz(text):
    for env in (make("connect_four"), make("nim")):
        r = env.parse(0, text)
        assert r.status in ("legal", "illegal", "unparsable")
        if r.ok:
            assert r.action in env.legal_actions(0)


def test_exact_minimax_names_a_game_too_large_to_solve(monkeypatch):
    """Connect Four's tree (about 4.5e12 positions) is out of reach: after MAX_STATES solved
    states the solver stops with an error naming the game and the bot to use instead."""
    from sparring.envs.bots import minimax

    monkeypatch.setattr(minimax, "MAX_STATES", 500)
    monkeypatch.setattr(minimax, "_CACHE", {})
    env = make("connect_four")
    env.reset(0)
    with pytest.raises(ValueError, match=r"gave up on 'connect_four' after solving 500 states"
                                         r".*too large.*'mcts'"):
        minimax_value(env)
    nim = make("nim", heaps=(1, 2))  # a small tree is solved as before, counted on its own
    nim.reset(0)
    assert minimax_value(nim) == 1.0  # 1 xor 2 != 0: the first mover wins (normal play)
