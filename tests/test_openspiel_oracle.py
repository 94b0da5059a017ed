"""Random play of our games against OpenSpiel, move for move: legal actions and returns."""

import random

import pytest

from sparring.envs import make

pyspiel = pytest.importorskip("pyspiel")

FAST, SLOW = 500, 10_000


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


def _poker(ours, theirs, n, names, params=None, options=None):
    """Our env deals (seeded); the same cards are fed to OpenSpiel's chance nodes."""
    game = pyspiel.load_game(theirs, params or {})
    env = make(ours, **(options or {}))
    for g in range(n):
        rng = random.Random(10_000 + g)
        env.reset(g)
        st = game.new_initial_state()
        dealt = 0
        while not st.is_terminal():
            if st.is_chance_node():
                card = env.cards[dealt]
                assert card in [o for o, _ in st.chance_outcomes()]
                st.apply_action(card)
                dealt += 1
                continue
            seat = env.current_seat()
            assert seat == st.current_player()
            legal = env.legal_actions(seat)
            assert [names.index(a) for a in legal] == st.legal_actions()
            a = rng.choice(legal)
            env.step(a)
            st.apply_action(names.index(a))
        assert env.current_seat() is None
        assert env.returns() == st.returns()


@pytest.mark.parametrize("n", [FAST, pytest.param(SLOW, marks=pytest.mark.slow)])
@pytest.mark.parametrize("players", [2, 3])
def test_kuhn_matches_openspiel(n, players):
    _poker("kuhn_poker", "kuhn_poker", n, ["pass", "bet"], {"players": players}, {"players": players})


@pytest.mark.parametrize("n", [FAST, pytest.param(SLOW, marks=pytest.mark.slow)])
def test_leduc_matches_openspiel(n):
    _poker("leduc", "leduc_poker", n, ["fold", "call", "raise"])


@pytest.mark.parametrize("n", [FAST, pytest.param(SLOW, marks=pytest.mark.slow)])
def test_connect_four_matches_openspiel(n):
    _board_game("connect_four", "connect_four", n, lambda a: int(a) - 1)


@pytest.mark.parametrize("misere", [False, True])
def test_nim_matches_openspiel(misere):
    game = pyspiel.load_game("nim", {"is_misere": misere, "pile_sizes": "1;3;5;7"})
    env = make("nim", misere=misere)
    for g in range(FAST):
        rng = random.Random(g)
        env.reset(g)
        st = game.new_initial_state()
        while not st.is_terminal():
            seat = env.current_seat()
            assert seat == st.current_player()
            ids = {st.action_to_string(a).rstrip(";"): a for a in st.legal_actions()}
            ours = {f"pile:{a.split(':')[0]}, take:{a.split(':')[1]}": a for a in env.legal_actions(seat)}
            assert set(ids) == set(ours)
            a = rng.choice(env.legal_actions(seat))
            env.step(a)
            st.apply_action(ids[f"pile:{a.split(':')[0]}, take:{a.split(':')[1]}"])
        assert env.returns() == st.returns()
