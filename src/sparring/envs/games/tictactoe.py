"""Tic-tac-toe: two seats, X (seat 0) moves first; actions are cells "1".."9" row by row.

Rewards at the end only: +1 win, -1 loss, 0 draw. No chance: ``reset(seed)`` gives the
empty board for every seed. Rules as in OpenSpiel's ``tic_tac_toe`` (cell k <-> action k-1).

Symmetries (for `sparring.envs.views.SymmetricViews`): the 8 of the square (dihedral
group D4), each a permutation ``p`` of the cells; through view ``v`` the cell shown at
index ``i`` is the board's cell ``VIEWS[v][i]`` (view 0 is the board as it is).
"""

from __future__ import annotations

from collections.abc import Sequence

from sparring.envs import register_env
from sparring.envs.base import Env, StepResult
from sparring.envs.games.common import TwoPlayerBoardGame
from sparring.envs.views import CanonicalViews, shared_view_memo

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
_LINES_THROUGH = tuple(tuple(ln for ln in LINES if c in ln) for c in range(9))
MARKS = ("X", "O")


def winning_cells(board: Sequence[str], mark: str) -> set[int]:
    """The empty cells (0-based) that complete a line of ``mark`` on ``board`` (9 cells,
    '.' empty)."""
    return {c for line in LINES for c in line
            if board[c] == "." and sum(board[i] == mark for i in line) == 2}


def tactic_at(board: Sequence[str], seat: int) -> tuple[str, set[int]] | None:
    """``seat``'s tactic on ``board``: ('win', its winning cells) if it has a win in one,
    else ('block', the cell) if the other seat has exactly one, else None."""
    wins, threats = winning_cells(board, MARKS[seat]), winning_cells(board, MARKS[1 - seat])
    if wins:
        return "win", wins
    return ("block", threats) if len(threats) == 1 else None
CELLS = tuple(str(i) for i in range(1, 10))


def _square_symmetries() -> tuple[tuple[int, ...], ...]:
    """The 8 symmetries of the 3x3 square as cell permutations, identity first: the view's
    cell (r, c) shows the board's cell ``f(r, c)`` for the 4 rotations and their mirrors."""
    maps = (lambda r, c: (r, c), lambda r, c: (2 - c, r), lambda r, c: (2 - r, 2 - c),
            lambda r, c: (c, 2 - r), lambda r, c: (r, 2 - c), lambda r, c: (2 - r, c),
            lambda r, c: (c, r), lambda r, c: (2 - c, 2 - r))
    return tuple(tuple(3 * f(i // 3, i % 3)[0] + f(i // 3, i % 3)[1] for i in range(9))
                 for f in maps)


VIEWS = _square_symmetries()


class TicTacToe(TwoPlayerBoardGame):
    name = "tictactoe"
    num_seats = 2
    ALL_ACTIONS = CELLS

    def __init__(self, compact: bool = False, numbered: bool = False,
                 lines: bool = False) -> None:
        for other, on in (("numbered", numbered), ("lines", lines)):
            if compact and on:
                raise ValueError(f"tictactoe: options 'compact' and {other!r} exclude each "
                                 "other (compact shows the mover only its mark and the cells "
                                 "in a row)")
        self.compact = bool(compact)
        self.numbered = bool(numbered)
        self.lines = bool(lines)
        self.reset(0)

    def reset(self, seed: int = 0) -> None:
        self.seed = seed
        self.board = ["."] * 9
        self.turn = 0
        self.winner: int | None = None
        self.done = False
        self._returns = [0.0, 0.0]

    def legal_actions(self, seat: int) -> list[str]:
        if self.done or seat != self.turn:
            return []
        b = self.board
        return [CELLS[i] for i in range(9) if b[i] == "."]

    def system_prompt(self, seat: int) -> str:
        """The rules, the same text for both seats (the observation names the seat), so a
        batch's prompts share it and it runs once (`sparring.policy.prefix`)."""
        self._check_seat(seat)
        empty = "An empty cell shows its number. " if self.numbered else ""
        if self.lines:
            empty += ("Under the board, its rows, columns and diagonals are written out, an "
                      "empty cell as its number. ")
        return ("Tic-tac-toe. X moves first. Cells are numbered\n"
                f"123\n456\n789\nGet three in a row. {empty}"
                "Reply with one cell, e.g. <answer>5</answer>.")

    def symmetries(self) -> int:
        """How many views `observation` and `view_action` / `board_action` know (8)."""
        return len(VIEWS)

    def view_action(self, action: str, view: int) -> str:
        """The board's cell ``action`` as named in view ``view``."""
        return CELLS[VIEWS[view].index(int(action) - 1)]

    def board_action(self, action: str, view: int) -> str:
        """The cell named ``action`` in view ``view``, as the board's cell."""
        return CELLS[VIEWS[view][int(action) - 1]]

    def observation(self, seat: int, view: int = 0) -> str:
        """What ``seat`` sees, through symmetry ``view`` of the board (0: as it is)."""
        self._check_seat(seat)
        b = "".join(self.board[i] for i in VIEWS[view])
        if self.compact and not self.done and seat == self.turn:
            return f"{MARKS[seat]} {b}"  # the mover's mark, then cells 1-9 in order
        if self.numbered:  # "X 2 3\n4 O 6\n7 8 9\n": a free cell reads as the answer that takes it
            cells = [c if c != "." else CELLS[i] for i, c in enumerate(b)]
            rows = "".join(" ".join(cells[r:r + 3]) + "\n" for r in (0, 3, 6))
        else:
            rows = f"{b[0:3]}\n{b[3:6]}\n{b[6:9]}\n"
        if self.lines:
            rows += _lines_text(b)
        if self.done:
            end = "Draw." if self.winner is None else f"{MARKS[self.winner]} wins."
            return rows + f"You are {MARKS[seat]}. Game over: {end}"
        if seat != self.turn:
            return rows + f"You are {MARKS[seat]}. Waiting for {MARKS[self.turn]}."
        if self.numbered:  # the numbers on the board are the legal moves
            return rows + f"You are {MARKS[seat]}. Your move."
        legal = sorted(self.view_action(a, view) for a in self.legal_actions(seat))
        return rows + f"You are {MARKS[seat]}. Legal: {' '.join(legal)}"

    def step(self, action: str) -> StepResult:
        if self.done or action not in CELLS or self.board[int(action) - 1] != ".":
            raise self._illegal(action)
        cell = int(action) - 1
        mark = MARKS[self.turn]
        b = self.board
        b[cell] = mark
        won = any(b[i] == mark and b[j] == mark and b[k] == mark for i, j, k in _LINES_THROUGH[cell])
        return self._after_move(won, "." not in b)

    def state_key(self) -> str:
        return "".join(self.board)


def _lines_text(shown: str) -> str:
    """Every line of the shown board, a free cell as its number: "Rows: X 2 O, 4 X 6, 7 8 O.
    Columns: X 4 7, 2 X 8, O 6 O. Diagonals: X X O, O X 7." (a column reads as a row does)."""
    def line(cells: tuple[int, ...]) -> str:
        return " ".join(shown[i] if shown[i] != "." else CELLS[i] for i in cells)

    groups = (("Rows", LINES[0:3]), ("Columns", LINES[3:6]), ("Diagonals", LINES[6:8]))
    return " ".join(f"{name}: {', '.join(line(c) for c in group)}." for name, group in groups) + "\n"


@register_env("tictactoe", family="game", source="classic; rules as OpenSpiel tic_tac_toe",
              aliases=("tic_tac_toe",))
def make_tictactoe(compact: bool = False, canonical: bool = False,
                   numbered: bool = False, lines: bool = False) -> Env:
    """Tic-tac-toe; ``compact``: the mover sees only its mark and cells 1-9 in order
    (``"O X...O.X.."``), for tiny models; ``numbered``: an empty cell shows its number
    (``"X 2 3"``) and the legal list is left out, so the move that completes or blocks a
    line is the number written in it (as TextArena's board, which SPIRAL trains on);
    ``lines``: under the board, its 8 lines written out the same way (``"Columns: X 4 7,
    2 X 8, O 6 O."``), so a column or diagonal reads as a row does (a SmolLM2 run learned
    to block along rows and not along columns: docs/benchmarks.md);
    ``canonical``: every seat sees the board in the
    orientation of the square whose text sorts first, and names its cells in it
    (`sparring.envs.views.CanonicalViews`: the four corner openings read as one)."""
    game = TicTacToe(compact=compact, numbered=numbered, lines=lines)
    if not canonical:
        return game
    return CanonicalViews(game, shared_view_memo(("tictactoe", compact, numbered, lines)))
