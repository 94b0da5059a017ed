import pytest

from sparring.envs import make
from sparring.envs.views import CanonicalViews, SymmetricViews
from sparring.memo import BoundedMemo

TTT_LINES = [{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {0, 3, 6}, {1, 4, 7}, {2, 5, 8}, {0, 4, 8}, {2, 4, 6}]


def test_tictactoe_views_are_the_eight_symmetries_of_the_square():
    """Each view is a permutation of the cells that maps the 8 winning lines onto
    themselves and the centre to itself; there are 8 distinct ones (the square's group has
    8 elements), identity first, closed under composition."""
    from sparring.envs.games.tictactoe import VIEWS

    assert len(set(VIEWS)) == 8 and VIEWS[0] == tuple(range(9))
    for p in VIEWS:
        assert sorted(p) == list(range(9)) and p[4] == 4
        assert sorted(map(sorted, ({p[i] for i in line} for line in TTT_LINES))) == \
            sorted(map(sorted, TTT_LINES))
    assert {tuple(p[q[i]] for i in range(9)) for p in VIEWS for q in VIEWS} == set(VIEWS)


@pytest.mark.parametrize("game, options", [("tictactoe", {"compact": True}), ("connect_four", {})])
def test_symmetric_views_play_the_same_game_in_each_seats_own_view(game, options):
    """Random play through the views: each seat's observation is the plain game's
    observation of the board seen through its view (for tic-tac-toe's compact text, cell i
    shown is the board's cell VIEWS[v][i]), its legal moves are the board's in its view,
    and the moves it names land on the board where its view says."""
    import random

    env = SymmetricViews(make(game, **options))
    plain = make(game, **options)
    rng = random.Random(0)
    seen_views = set()
    for seed in range(30):
        env.reset(seed)
        plain.reset(seed)
        seen_views.add(tuple(env.views))
        while env.current_seat() is not None:
            seat = env.current_seat()
            v = env.views[seat]
            legal = env.legal_actions(seat)
            assert legal == sorted(plain.view_action(a, v) for a in plain.legal_actions(seat))
            if game == "tictactoe":
                from sparring.envs.games.tictactoe import VIEWS

                board = plain.state_key()
                assert env.observation(seat) == "XO"[seat] + " " + "".join(board[VIEWS[v][i]]
                                                                           for i in range(9))
            else:
                rows = plain.observation(seat).split("\n")[:6]
                assert env.observation(seat).split("\n")[:6] == \
                    [r[::-1] if v else r for r in rows]
            move = rng.choice(legal)
            assert env.parse(seat, f"<answer>{move}</answer>").action == move
            a = env.step(move)
            b = plain.step(plain.board_action(move, v))
            assert a.rewards == b.rewards and a.done == b.done
            assert env.state_key().split("|")[0] == plain.state_key()
        assert env.returns() == plain.returns()
    assert len(seen_views) > 4 if game == "tictactoe" else len(seen_views) == 4
    env.reset(7)
    first = list(env.views)
    env.reset(7)
    assert env.views == first  # drawn from the reset seed


def test_symmetric_views_keep_minimax_value_and_search_through_clones():
    """Minimax through per-seat views still draws (the game's value is unchanged) and
    the views are kept by clones (the bot searches copies)."""
    from sparring.envs.bots import make_bot

    env = SymmetricViews(make("tictactoe", compact=True))
    bot = make_bot("minimax", 0)
    for seed in range(6):
        env.reset(seed)
        while env.current_seat() is not None:
            seat = env.current_seat()
            env.step(env.parse(seat, bot(env, seat)).action)
        assert env.returns() == [0.0, 0.0]
    twin = env.clone()
    assert twin.views == env.views and twin.env is not env.env


def test_symmetric_views_need_a_game_with_symmetries():
    with pytest.raises(ValueError, match="kuhn_poker declares no symmetries"):
        SymmetricViews(make("kuhn_poker"))


def _ttt_after(moves: list[int]) -> list[str]:
    """The plain board (cells 0-8) after ``moves`` (board cells), X first."""
    board = ["."] * 9
    for k, c in enumerate(moves):
        board[c] = "XO"[k % 2]
    return board


def test_canonical_views_show_symmetric_positions_alike_and_map_moves_back():
    """Every position reached by random play reads the same as each of its 8 images under
    the square's symmetries (played as such from the start); the text is the smallest of
    the 8 ways to write the board; and the move the seat names lands on the board's cell
    its view says (checked against a plain game fed the mapped moves)."""
    import random

    from sparring.envs.games.tictactoe import VIEWS

    rng = random.Random(1)
    for _ in range(40):
        env, plain = make("tictactoe", compact=True, canonical=True), make("tictactoe")
        moves: list[int] = []
        while env.current_seat() is not None:
            seat = env.current_seat()
            board = _ttt_after(moves)
            texts = {"XO"[seat] + " " + "".join(board[p[i]] for i in range(9)) for p in VIEWS}
            obs = env.observation(seat)
            assert obs == min(texts)
            twins = []  # the position turned by each symmetry reads the same
            for p in VIEWS:
                image = CanonicalViews(make("tictactoe", compact=True))
                image.env.board, image.env.turn = [board[p[i]] for i in range(9)], seat
                twins.append(image.observation(seat))
            assert set(twins) == {obs}
            move = rng.choice(env.legal_actions(seat))
            view = env.view(seat)
            twin = env.clone()  # a clone that moves on leaves this position's view as it was
            twin.step(rng.choice(twin.legal_actions(seat)))
            if twin.current_seat() is not None:
                twin.observation(1 - seat)
            assert env.view(seat) == view and env.observation(seat) == obs
            cell = VIEWS[view][int(move) - 1]  # the board cell it names
            assert env.parse(seat, f"<answer>{move}</answer>").action == move
            a, b = env.step(move), plain.step(str(cell + 1))
            moves.append(cell)
            assert a.rewards == b.rewards and a.done == b.done
            assert env.state_key() == plain.state_key() == "".join(_ttt_after(moves))
        assert env.returns() == plain.returns()


def test_canonical_views_by_hand_and_through_bots():
    """By hand: after X takes corner 3, O sees it in corner 9 (``'.'`` sorts before
    ``'X'``), and O's canonical 1 (the opposite corner) is the board's 7. Minimax plays the
    canonical game to a draw against itself (its search clones and steps the wrapper).
    Connect Four mirrors: X's piece in column 1 is seen by O in column 7, so O's column 7
    is the board's column 1."""
    from sparring.envs.bots import make_bot

    env = make("tictactoe", compact=True, canonical=True)
    assert env.observation(0) == "X ........." and env.legal_actions(0) == list("123456789")
    env.step("3")
    assert env.observation(1) == "O ........X"
    env.step("1")
    assert env.state_key() == "..X...O.."
    bot = make_bot("minimax", 0)
    for seed in range(4):
        env = make("tictactoe", compact=True, canonical=True)
        env.reset(seed)
        while env.current_seat() is not None:
            seat = env.current_seat()
            env.step(env.parse(seat, bot(env, seat)).action)
        assert env.returns() == [0.0, 0.0]
    c4 = make("connect_four", canonical=True)
    c4.step("1")
    assert c4.observation(1).split("\n")[5] == "......X"
    c4.step("7")  # O's column 7 as seen: the board's column 1
    assert c4.state_key() == make_c4_after(["1", "1"])
    with pytest.raises(ValueError, match="kuhn_poker declares no symmetries"):
        CanonicalViews(make("kuhn_poker"))


def test_canonical_views_share_a_memo_per_option_set_and_empty_it_when_full():
    """Games made with the same options share the memo of views, games written otherwise
    do not; a memo at its size is emptied and the views stay those computed afresh (the
    smallest of the 8 texts)."""
    import random

    a, b = (make("tictactoe", compact=True, canonical=True) for _ in range(2))
    other = make("tictactoe", numbered=True, canonical=True)
    assert a.memo is b.memo and a.memo is not other.memo
    env = CanonicalViews(make("tictactoe", compact=True), memo=BoundedMemo(3))
    rng = random.Random(0)
    for _ in range(5):
        env.reset(0)
        while env.current_seat() is not None:
            seat = env.current_seat()
            texts = [env.env.observation(seat, view=v) for v in range(8)]
            assert env.observation(seat) == min(texts) and len(env.memo) <= 3
            view = min(range(8), key=lambda v: (texts[v], v))
            legal = sorted(env.env.view_action(a, view) for a in env.env.legal_actions(seat))
            assert env.legal_actions(seat) == legal
            env.step(rng.choice(env.legal_actions(seat)))


def test_canonical_views_write_a_position_once_and_hand_out_fresh_move_lists():
    """The first look at a position writes its 8 texts; its observation, view and legal
    moves after that come from the memo, not from the game again; a caller that changes
    the list of legal moves it got does not change the next caller's."""
    game = make("tictactoe", compact=True)
    written = []
    observe = game.observation
    game.observation = lambda seat, view=0: written.append(view) or observe(seat, view=view)
    env = CanonicalViews(game)
    env.step("5")
    written.clear()
    first, view = env.observation(1), env.view(1)
    assert len(written) == 8
    for _ in range(3):
        assert (env.observation(1), env.view(1)) == (first, view)
        moves = env.legal_actions(1)
        assert len(moves) == 8
        moves.clear()
    assert len(written) == 8


def make_c4_after(columns: list[str]) -> str:
    game = make("connect_four")
    for c in columns:
        game.step(c)
    return game.state_key()
