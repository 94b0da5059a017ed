from collections import Counter

import pytest

from sparring.envs import make
from sparring.envs.wrappers import (
    CanonicalViews,
    RandomOpening,
    SymmetricViews,
    TryAgain,
    TurnBudget,
    check_openings,
)
from sparring.memo import BoundedMemo

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
            env.step(rng.choice(env.legal_actions(seat)))


def make_c4_after(columns: list[str]) -> str:
    game = make("connect_four")
    for c in columns:
        game.step(c)
    return game.state_key()


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
