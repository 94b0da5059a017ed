"""Random play of our games against OpenSpiel, move for move: legal actions and returns."""

import random

import pytest

from sparring.envs import make

pyspiel = pytest.importorskip("pyspiel")

FAST, SLOW = 300, 3000


def _board_game(ours, theirs, n, to_id, seed0=0):
    game = pyspiel.load_game(theirs)
    env = make(ours)
    for g in range(n):
        rng = random.Random(seed0 + g)
        env.reset(g)
        st = game.new_initial_state()
        while not st.is_terminal():
            seat = env.current_seat()
            assert seat == st.current_player()
            legal = env.legal_actions(seat)
            assert [to_id(a) for a in legal] == st.legal_actions()
            a = rng.choice(legal)
            env.step(a)
            st.apply_action(to_id(a))
        assert env.current_seat() is None
        assert env.returns() == st.returns()


@pytest.mark.parametrize("n", [FAST, pytest.param(SLOW, marks=pytest.mark.slow)])
def test_tictactoe_matches_openspiel(n):
    _board_game("tictactoe", "tic_tac_toe", n, lambda a: int(a) - 1)
