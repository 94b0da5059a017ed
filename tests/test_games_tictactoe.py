import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparring.envs import make
from sparring.envs.bots import MinimaxBot, RandomBot, minimax_value


def play(env, moves):
    res = None
    for m in moves:
        res = env.step(m)
    return res


def test_row_win_and_rewards():
    env = make("tictactoe")
    env.reset(3)
    res = play(env, ["1", "4", "2", "5", "3"])  # X: 1 2 3
    assert res.done and res.rewards == [1.0, -1.0]
    assert env.returns() == [1.0, -1.0]
    assert env.current_seat() is None
    assert env.legal_actions(0) == [] and env.legal_actions(1) == []
    assert env.state_key() == "XXXOO...."
    assert "X wins" in env.observation(1)


def test_o_wins_diagonal_and_draw():
    env = make("tictactoe")
    env.reset(0)
    res = play(env, ["2", "1", "3", "5", "4", "9"])  # O: 1 5 9
    assert res.done and res.rewards == [-1.0, 1.0]
    env.reset(0)
    # X O X / X O O / O X X  -> draw
    res = play(env, ["1", "2", "3", "5", "4", "6", "8", "7", "9"])
    assert res.done and res.rewards == [0.0, 0.0] and res.info["winner"] is None


def test_observation_and_legal():
    env = make("tictactoe")
    env.reset(0)
    play(env, ["5", "1"])
    assert env.current_seat() == 0
    assert env.legal_actions(0) == ["2", "3", "4", "6", "7", "8", "9"]
    assert env.legal_actions(1) == []
    assert env.observation(0) == "O..\n.X.\n...\nYou are X. Legal: 2 3 4 6 7 8 9"
    assert env.observation(1).endswith("Waiting for X.")
    with pytest.raises(ValueError, match="illegal action '5'"):
        env.step("5")
    with pytest.raises(ValueError, match="illegal action 'ten'"):
        env.step("ten")
    with pytest.raises(ValueError, match="seat"):
        env.observation(2)


def test_parse_and_clone():
    env = make("tictactoe")
    env.reset(0)
    env.step("5")
    assert env.parse(1, "I pick <answer>3</answer>").action == "3"
    assert env.parse(1, "corner 1 then maybe 9").action == "9"
    assert env.parse(1, "5").status == "illegal"
    assert env.parse(1, "hello").status == "unparsable"
    assert env.parse(0, "3").status == "illegal"  # not seat 0's turn
    c = env.clone()
    c.step("1")
    assert env.state_key() == "....X...." and c.state_key() == "O...X...."


HUGE = st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=20), st.integers(300, 3000))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.binary(), HUGE))
def test_parse_fuzz(text):
    env = make("tictactoe")
    env.reset(0)
    r = env.parse(0, text)
    assert r.status in ("legal", "illegal", "unparsable")
    if r.ok:
        assert r.action in env.legal_actions(0)


def _ref_value(board: str, turn: str) -> int:
    """Independent brute-force negamax on strings (no memo), from X's view."""
    lines = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
    for a, b, c in lines:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return 1 if board[a] == "X" else -1
    if "." not in board:
        return 0
    vals = [_ref_value(board[:i] + turn + board[i + 1:], "O" if turn == "X" else "X")
            for i in range(9) if board[i] == "."]
    return max(vals) if turn == "X" else min(vals)


def test_minimax_values_match_reference():
    env = make("tictactoe")
    env.reset(0)
    assert minimax_value(env) == 0.0  # tic-tac-toe is a draw
    for moves in (["1", "2"], ["2", "5"], ["5", "2", "1"], ["1", "5", "9", "3"], ["2", "1", "3"]):
        env.reset(0)
        play(env, moves)
        turn = "X" if len(moves) % 2 == 0 else "O"
        assert minimax_value(env) == _ref_value(env.state_key(), turn), moves


def _match(first, second, n, env):
    out = {1.0: 0, 0.0: 0, -1.0: 0}
    for g in range(n):
        env.reset(g)
        while (s := env.current_seat()) is not None:
            env.step((first if s == 0 else second).act(env, s))
        out[env.returns()[0]] += 1
    return out


@pytest.mark.parametrize("n", [5000, pytest.param(10000, marks=pytest.mark.slow)])
def test_minimax_vs_random(n):
    env = make("tictactoe")
    first = _match(MinimaxBot(1), RandomBot(2), n, env)
    assert first[-1.0] == 0 and first[1.0] / n >= 0.95
    second = _match(RandomBot(3), MinimaxBot(4), n, env)
    assert second[1.0] == 0 and second[-1.0] / n >= 0.75


def test_minimax_self_play_draws():
    env = make("tictactoe")
    assert _match(MinimaxBot(5), MinimaxBot(6), 200, env) == {1.0: 0, 0.0: 200, -1.0: 0}


def test_compact_observation_is_mark_and_cells_in_order():
    from sparring.envs import make

    env = make("tictactoe", compact=True)
    env.reset(0)
    assert env.observation(0) == "X ........."
    env.step("5")
    env.step("1")
    assert env.observation(0) == "X O...X...."
    assert "Waiting for X" in env.observation(1)  # the seat not to move sees the full text


def test_numbered_observation_writes_each_free_cell_as_its_answer():
    from sparring.envs import make

    env = make("tictactoe", numbered=True)
    env.reset(0)
    for cell in ("1", "5", "2"):
        env.step(cell)
    # X on 1 and 2, O on 5: O blocks with the number written in the top row
    assert env.observation(1) == "X X 3\n4 O 6\n7 8 9\nYou are O. Your move."
    assert "An empty cell shows its number." in env.system_prompt(1)
    assert "empty cell" not in make("tictactoe").system_prompt(1)
    # canonical: numbered in the view's own order, so a number names the cell a reply names
    turned, canon = (make("tictactoe", numbered=True, canonical=True) for _ in range(2))
    for game, moves in ((canon, ("1", "5", "2")), (turned, ("9", "5", "8"))):  # 180 degrees
        game.reset(0)
        for cell in moves:
            game.env.step(cell)  # board cells (the wrapper's step takes the mover's view)
    assert canon.observation(1) == turned.observation(1) == "1 2 3\n4 O 6\n7 X X\nYou are O. Your move."
    for game, block in ((canon, "3"), (turned, "7")):
        assert game.parse(1, "<answer>7</answer>").action == "7"
        game.step("7")
        assert game.env.board[int(block) - 1] == "O"
    with pytest.raises(ValueError, match="'compact' and 'numbered'"):
        make("tictactoe", numbered=True, compact=True)


def test_lines_write_out_every_row_column_and_diagonal():
    from sparring.envs import make

    env = make("tictactoe", lines=True)
    env.reset(0)
    for cell in ("1", "5", "9", "3"):  # X 1, O 5, X 9, O 3: O threatens 7 on a diagonal
        env.step(cell)
    assert env.observation(0) == (
        "X.O\n.O.\n..X\n"
        "Rows: X 2 O, 4 O 6, 7 8 X. Columns: X 4 7, 2 O 8, O 6 X. Diagonals: X O X, O O 7.\n"
        "You are X. Legal: 2 4 6 7 8")
    assert "rows, columns and diagonals are written out" in env.system_prompt(0)
    # canonical: the lines of the shown view, numbered in its order (the board above turned
    # so that its text sorts first), so the block reads "7" on the board and in the lines
    canon = make("tictactoe", lines=True, canonical=True)
    canon.reset(0)
    for cell in ("1", "5", "9", "3"):
        canon.env.step(cell)
    shown = canon.observation(0)
    assert shown.startswith("..X\n.O.\nX.O\nRows: 1 2 X, 4 O 6, X 8 O. Columns: 1 4 X, 2 O 8,")
    assert "Diagonals: 1 O O, X O X." in shown
    canon.step("1")  # the cell the lines name is the one that blocks
    assert canon.env.board[6] == "X"
    with pytest.raises(ValueError, match="'compact' and 'lines'"):
        make("tictactoe", lines=True, compact=True)
