"""The PettingZoo adapter against our own games (same move choices, same returns game by game),
a parallel env through parallel_to_aec, parsing, and the errors."""

import random
import sys

import pytest

from sparring.envs import make

pytest.importorskip("pettingzoo", reason="needs the 'pettingzoo' extra: "
                    "pip install 'sparring[pettingzoo]'")
pytest.importorskip("pygame", reason="PettingZoo's classic games import pygame: "
                    "pip install 'sparring[pettingzoo]' (pygame-ce)")

PZ = "sparring.envs.adapters.pettingzoo"


def _tictactoe():
    return make("pettingzoo", env="classic/tictactoe-v3",
                obs_to_text=f"{PZ}:tictactoe_text", action_to_text=f"{PZ}:TICTACTOE_CELLS")


def _connect_four():
    return make("pettingzoo", env="classic/connect_four-v3",
                obs_to_text=f"{PZ}:connect_four_text", action_to_text=f"{PZ}:CONNECT_FOUR_COLUMNS")


def _play_both(ad, ours, games: int) -> list[list[float]]:
    """Drive both with the same move choices (uniform among our legal moves); returns the
    per-game returns, after checking they agree step by step."""
    outcomes = []
    for g in range(games):
        rng = random.Random(1000 + g)
        ad.reset(g)
        ours.reset(g)
        while (seat := ours.current_seat()) is not None:
            assert ad.current_seat() == seat
            legal = ours.legal_actions(seat)
            assert sorted(ad.legal_actions(seat)) == sorted(legal)
            assert ad.legal_actions(1 - seat) == []
            move = rng.choice(legal)
            r1, r2 = ad.step(move), ours.step(move)
            assert r1.rewards == r2.rewards and r1.done == r2.done
        assert ad.current_seat() is None
        assert ad.returns() == ours.returns()
        outcomes.append(ad.returns())
    return outcomes


def test_tictactoe_random_play_matches_ours():
    outcomes = _play_both(_tictactoe(), make("tictactoe"), 200)
    wins = {tuple(r) for r in outcomes}
    assert wins == {(1.0, -1.0), (-1.0, 1.0), (0.0, 0.0)}  # all three outcomes occurred


def test_connect_four_random_play_matches_ours():
    outcomes = _play_both(_connect_four(), make("connect_four"), 200)
    assert {tuple(r) for r in outcomes} >= {(1.0, -1.0), (-1.0, 1.0)}


def test_tictactoe_views_and_parsing():
    env = _tictactoe()
    env.reset(0)
    env.step("5")  # X (player_1) takes the centre; PettingZoo's square 4
    env.step("1")  # O (player_2) takes the top-left corner; square 0
    # player_1 sees its mark as X; cells are numbered row by row
    assert env.observation(0).splitlines()[:3] == ["O..", ".X.", "..."]
    assert env.observation(1).splitlines()[:3] == ["X..", ".O.", "..."]
    compact = make("pettingzoo", env="classic/tictactoe-v3", annotate=False,
                   obs_to_text=f"{PZ}:tictactoe_cells", action_to_text=f"{PZ}:TICTACTOE_CELLS")
    compact.step("5")
    assert compact.observation(1) == "....O...." and compact.observation(0) == "....X...."
    assert "Legal: " in env.observation(0) and "Waiting for player_1" in env.observation(1)
    assert env.parse(0, "I take <answer>9</answer>").action == "9"
    assert env.parse(0, "<answer>5</answer>").status == "illegal"  # taken
    assert env.parse(0, "nothing").status == "unparsable"
    assert env.parse(7, "9").status == "unparsable"
    with pytest.raises(ValueError, match="illegal action '5'"):
        env.step("5")
    k = env.state_key()
    c = env.clone()
    assert c.state_key() == k and c.observation(0) == env.observation(0)
    c.step("9")
    assert env.state_key() == k and c.state_key() != k and env.current_seat() == 0


def test_clone_serves_minimax_as_our_game_does():
    """Minimax values (which clone and step the env) agree with those of our tic-tac-toe."""
    from sparring.envs.bots.minimax import minimax_value

    ad, ours = _tictactoe(), make("tictactoe")
    for g in range(6):
        rng = random.Random(g)
        ad.reset(g)
        ours.reset(g)
        for _ in range(4):  # a random opening, then the value of the position
            move = rng.choice(ours.legal_actions(ours.current_seat()))
            ad.step(move)
            ours.step(move)
        assert minimax_value(ad) == minimax_value(ours)


def test_parallel_env_through_parallel_to_aec():
    """Rock-paper-scissors is a parallel env: each round both seats act in turn, the round
    pays +1/-1 (rock beats scissors beats paper beats rock); 4 rounds, then truncation."""
    names = ["rock", "paper", "scissors"]
    beats = {("rock", "scissors"), ("scissors", "paper"), ("paper", "rock")}
    env = make("pettingzoo", env="classic/rps-v2", parallel=True,
               env_kwargs={"max_cycles": 4}, obs_to_text=lambda o: f"last: {int(o)}",
               action_to_text=names)
    for g in range(30):
        rng = random.Random(g)
        env.reset(g)
        expect, last = [0.0, 0.0], None
        for _ in range(4):
            a, b = rng.choice(names), rng.choice(names)
            assert env.current_seat() == 0 and env.legal_actions(0) == names
            env.step(a)
            assert env.current_seat() == 1
            last = env.step(b)
            score = 1.0 if (a, b) in beats else -1.0 if (b, a) in beats else 0.0
            expect = [expect[0] + score, expect[1] - score]
        assert last.done and last.info == {"truncated": True}
        assert env.returns() == expect and env.current_seat() is None


def test_module_and_callable_names_build_the_same_game():
    """The older module form and "module:callable" (any factory of yours) work too."""
    by_module = make("pettingzoo", env="pettingzoo.classic.tictactoe.tictactoe",
                     obs_to_text=f"{PZ}:tictactoe_text", action_to_text=f"{PZ}:TICTACTOE_CELLS")
    by_callable = make("pettingzoo", env="pettingzoo.classic.tictactoe.tictactoe:raw_env",
                       obs_to_text=f"{PZ}:tictactoe_text")
    assert by_module.legal_actions(0) == _tictactoe().legal_actions(0)
    assert by_callable.legal_actions(0) == [str(a) for a in range(9)]  # default: str(action)


def test_action_codec_checks():
    env = make("pettingzoo", env="classic/connect_four-v3",
               obs_to_text=f"{PZ}:connect_four_text", action_to_text=lambda a: f"c{a}",
               text_to_action=lambda t: int(t[1:]))
    assert env.legal_actions(0) == [f"c{a}" for a in range(7)]
    with pytest.raises(ValueError, match="must be inverses"):
        make("pettingzoo", env="classic/connect_four-v3", obs_to_text=str,
             text_to_action=lambda t: int(t) - 1)  # default action_to_text is str(action)


def test_errors_name_the_problem(monkeypatch):
    with pytest.raises(ValueError, match="give obs_to_text"):
        make("pettingzoo", env="classic/tictactoe-v3")
    with pytest.raises(ValueError, match="cannot import module 'no_such_pkg.game_v0'"):
        make("pettingzoo", env="no_such_pkg.game_v0", obs_to_text=str)
    with pytest.raises(ValueError, match="cannot make 'classic/nope-v1'"):
        make("pettingzoo", env="classic/nope-v1", obs_to_text=str)
    with pytest.raises(ValueError, match="has no attribute 'nope_text'"):
        make("pettingzoo", env="classic/tictactoe-v3",
             obs_to_text="sparring.envs.adapters.pettingzoo:nope_text")
    with pytest.raises(TypeError, match="expected an AECEnv"):
        make("pettingzoo", env=object(), obs_to_text=str)
    monkeypatch.setitem(sys.modules, "pettingzoo", None)
    with pytest.raises(ImportError, match=r"'pettingzoo' extra: pip install 'sparring\[pettingzoo\]'"):
        _tictactoe()
