"""Two-ply lookahead (sparring.envs.lookahead): positions checked by hand, the
tactical bot, exploring opponents that draw among the moves it keeps."""

import pytest

from sparring.envs import make
from sparring.envs.bots import BOTS, make_bot
from sparring.envs.lookahead import check_lookahead, tactical_actions
from sparring.envs.views import SymmetricViews


def _board(*moves, **options):
    env = make("tictactoe", compact=True, **options)
    env.reset(0)
    for m in moves:
        env.step(m)
    return env


def test_an_empty_board_keeps_every_move():
    assert tactical_actions(_board(), 0) == [str(c) for c in range(1, 10)]


def test_a_win_in_one_is_taken():
    # X 1, O 5, X 2, O 9: X wins at 3 (row 1-2-3); O's threat 1-5-9 is taken, so 3 alone
    assert tactical_actions(_board("1", "5", "2", "4"), 0) == ["3"]


def test_a_threat_is_blocked():
    # X 1, O 5, X 2: O cannot win in one; X threatens 3, the one move that does not lose
    assert tactical_actions(_board("1", "5", "2"), 1) == ["3"]
    # then O 3 threatens 7 (3-5-7): X must block there
    assert tactical_actions(_board("1", "5", "2", "3"), 0) == ["7"]


def test_a_fork_leaves_every_move():
    # X 1, O 2, X 5, O 9, X 4: X threatens 7 (1-4-7) and 6 (4-5-6); O has no win in one,
    # every move loses, so none is singled out
    env = _board("1", "2", "5", "9", "4")
    assert tactical_actions(env, 1) == env.legal_actions(1) == ["3", "6", "7", "8"]


def test_views_name_the_moves_of_the_movers_view():
    env = SymmetricViews(make("tictactoe", compact=True))
    for seed in range(20):
        env.reset(seed)
        for m in ("1", "5", "2"):  # the moves of each mover's own view
            env.step(m)
        (block,) = tactical_actions(env, 1)
        twin = env.clone()
        twin.step(block)  # O's block in its view, then X cannot win in one
        assert all(not _wins(twin, 0, a) for a in twin.legal_actions(0))


def _wins(env, seat, action):
    twin = env.clone()
    twin.step(action)
    return twin.current_seat() is None and twin.returns()[seat] > twin.returns()[1 - seat]


def test_nim_takes_the_last_objects_and_never_leaves_one_heap():
    one = make("nim", heaps=(2,))
    one.reset(0)
    assert tactical_actions(one, 0) == ["1:2"]  # taking both ends the game: a win
    two = make("nim", heaps=(1, 3))
    two.reset(0)
    # 1:1 and 2:3 leave a single heap, which the next mover takes whole; 2:1, 2:2 do not
    assert tactical_actions(two, 0) == ["2:1", "2:2"]


def test_games_with_hidden_deals_are_refused():
    with pytest.raises(ValueError, match="hidden chance deals"):
        check_lookahead(make("kuhn_poker"))
    check_lookahead(make("tictactoe"))
    kuhn = make("kuhn_poker")
    kuhn.reset(0)
    with pytest.raises(ValueError, match="hidden chance deals"):
        make_bot("tactical", seed=0)(kuhn, 0)


def test_the_tactical_bot_wins_blocks_and_otherwise_spreads():
    assert "tactical" in BOTS
    bot = make_bot("tactical", seed=3)
    assert bot(_board("1", "5", "2"), 1) == "3"
    firsts = [bot(_board(), 0) for _ in range(900)]
    for c in "123456789":  # uniform on the empty board: 100 each
        assert abs(firsts.count(c) - 100) < 4 * (900 * (1 / 9) * (8 / 9)) ** 0.5
