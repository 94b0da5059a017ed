"""bench/must_block.py's position list, checked on boards worked out by hand."""

from sparring.envs.games.tictactoe import winning_cells
from tests.helpers import load_bench

must_block = load_bench("must_block")


def test_must_block_positions_by_hand():
    found = {"".join(b): (seat, cell) for b, seat, cell in must_block.must_block_positions()}
    # X on 1 and 2, O on 5: O must take 3 (index 2)
    assert found["XX..O...."] == (1, 2)
    # O on 5 and 8 threatens 2; X on 3 and 7 has no open line of two: X must take 2
    assert found["..X.O.XO."] == (0, 1)
    # a fork (X1 O5 X2 O9 X4: X threatens 3 and 7): no move saves O, so not listed
    assert "XX.XO...O" not in found
    # X to move can win at 3: not listed although O threatens 6
    assert "XX.OO...." not in found
    # unreachable (O ahead of X) and finished boards are not listed
    assert "OO.O....X" not in found and "XXXOO...." not in found
    for board, (seat, cell) in found.items():  # the definition, on every entry
        b = list(board)
        assert b.count("X") - b.count("O") == (1 if seat == 1 else 0)
        assert not winning_cells(b, "XO"[seat])
        assert winning_cells(b, "XO"[1 - seat]) == {cell}


def test_must_win_positions_by_hand():
    found = {"".join(b): (seat, cells) for b, seat, cells in must_block.must_win_positions()}
    # X on 1 and 2 to move: 3 completes the row (O's own two on 4, 5 do not matter)
    assert found["XX.OO...."] == (0, {2})
    # O on 4 and 5 to move wins at 6, though X threatens too
    assert found["X.XOO...X"] == (1, {5})
    # two wins at once: X on 1, 2, 4 completes the top row at 3 or the left column at 7
    assert found["XX.X.O.OO"] == (0, {2, 6})
    # O to move without a win of its own and one X threat: a block, not a win
    assert "XX..O...." not in found
    blocks = {"".join(b) for b, _, _ in must_block.must_block_positions()}
    assert not blocks & set(found)  # a position is one or the other
    for board, (seat, cells) in found.items():
        assert winning_cells(list(board), "XO"[seat]) == cells


def test_line_direction_is_read_in_the_shown_view():
    from sparring.envs.games.tictactoe import VIEWS

    board = list("XX.OO....")
    assert must_block.line_direction(board, 0, {2}, "X") == "row"
    assert must_block.line_direction(list("X..X....."), 0, {6}, "X") == "column"
    assert must_block.line_direction(list("X...X...."), 0, {8}, "X") == "diagonal"
    # X on 1, 2, 4: cell 7 completes the left column only, cell 3 the top row only
    assert must_block.line_direction(list("XX.X....."), 0, {6}, "X") == "column"
    # two lines at once through cell 1 (X on 2, 3 and on 4, 7)
    assert must_block.line_direction(list(".XXX..X.."), 0, {0}, "X") == "several"
    # two winning cells, one along a row (3) and one along a column (7)
    assert must_block.line_direction(list("XX.X.O.OO"), 0, {2, 6}, "X") == "several"
    transpose = VIEWS.index((0, 3, 6, 1, 4, 7, 2, 5, 8))  # shown cell v = board cell T[v]
    assert must_block.line_direction(board, transpose, {2}, "X") == "column"


def test_uniform_visits_count_what_a_replayed_game_passes():
    """The counts of a few random games equal a hand replay of the same games' positions
    through the position list (the unturned board: no canonical view)."""
    import random

    from sparring.envs import make

    got = must_block.uniform_visits({}, 30, seed=3)
    listed = {"".join(b): (kind, cells) for b, _, kind, cells in must_block.tactic_positions()}
    rng, want = random.Random(3), {}
    for g in range(30):
        env = make("tictactoe")
        env.reset(g)
        while not env.done:
            key = "".join(env.board)
            if key in listed:
                kind, cells = listed[key]
                mark = "XO"[env.turn] if kind == "win" else "XO"[1 - env.turn]
                d = must_block.line_direction(list(key), 0, cells, mark)
                want[kind, d] = want.get((kind, d), 0) + 1
            env.step(rng.choice(env.legal_actions(env.turn)))
    assert dict(got) == want and sum(want.values()) > 0


def test_own_visits_follow_the_policy_and_score_its_good_move(monkeypatch):
    """A policy that always takes the lowest free cell plays X1 O2 X3 O4 X5 O6 X7 in every
    game: after O6, X can win at 7 or 9, both along diagonals (1-5-9, 3-5-7), and it does
    (probability 1 on 7). After X5, X threatens two cells, so O's position is no must-block;
    no earlier position has a tactic. So each game meets one must-win by diagonal."""
    import sparring.eval.games as games

    def first_free(policy, arena, positions):
        out = []
        for env, seat in positions:
            legal = sorted(env.legal_actions(seat), key=int)
            out.append({a: float(a == legal[0]) for a in legal})
        return out

    monkeypatch.setattr(games, "probabilities_at", first_free)
    met = must_block.own_visits(None, None, {}, 5)
    assert met == {("win", "diagonal"): [1.0] * 5}


def test_misses_lists_only_failed_positions_with_their_board(capsys):
    """Two must-block positions worked out by hand, one answered right and one not: only the
    second is printed, with its shown rows, the move taken and p(block)."""
    from sparring.envs import make

    positions = []
    for board, seat in (("XX..O....", 1), ("..X.O.XO.", 0)):
        env = make("tictactoe")
        env.board, env.turn = list(board), seat
        positions.append((env, seat))
    probs = [{"3": 0.9, "4": 0.1}, {"1": 0.7, "2": 0.2, "4": 0.1}]
    must_block.print_misses("run", positions, ["block", "block"], [{"3"}, {"2"}],
                            ["row", "column"], probs)
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["run  missed X must-block (4 marks, column): ..X / .O. / XO. -> 1 at p "
                   "0.70; 2 at p 0.20"]
