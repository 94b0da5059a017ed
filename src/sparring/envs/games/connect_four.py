"""Connect Four: 7 columns x 6 rows, X (seat 0) first; actions are columns "1".."7".

A piece drops to the lowest empty cell of its column; four in a row (horizontal, vertical
or diagonal) wins (+1 / -1); a full board is a draw (0). No chance. Rules as OpenSpiel's
``connect_four`` (column k <-> action k-1).

Symmetries (for `sparring.envs.views.SymmetricViews`): the board as it is (view 0) and
its mirror image (view 1: column k shown as column 8 - k).
"""

from __future__ import annotations

from sparring.envs import register_env
from sparring.envs.base import Env, StepResult
from sparring.envs.games.common import TwoPlayerBoardGame
from sparring.envs.views import CanonicalViews, shared_view_memo

COLS, ROWS = 7, 6
MARKS = ("X", "O")
COLUMNS = tuple(str(c) for c in range(1, COLS + 1))
_DIRS = ((1, 0), (0, 1), (1, 1), (1, -1))


class ConnectFour(TwoPlayerBoardGame):
    name = "connect_four"
    num_seats = 2
    ALL_ACTIONS = COLUMNS

    def __init__(self) -> None:
        self.reset(0)

    def reset(self, seed: int = 0) -> None:
        self.seed = seed
        self.grid = ["."] * (COLS * ROWS)  # index col * ROWS + row, row 0 at the bottom
        self.height = [0] * COLS
        self.turn = 0
        self.moves = 0
        self.winner: int | None = None
        self.done = False
        self._returns = [0.0, 0.0]

    def legal_actions(self, seat: int) -> list[str]:
        if self.done or seat != self.turn:
            return []
        h = self.height
        return [COLUMNS[c] for c in range(COLS) if h[c] < ROWS]

    def system_prompt(self, seat: int) -> str:
        self._check_seat(seat)
        # the same rules for both seats (the observation names the seat): one shared prefix
        return ("Connect Four, 7 columns x 6 rows. X moves first. "
                "Drop a piece into a column (1-7); get four in a row in any direction. "
                "Reply with one column, e.g. <answer>4</answer>.")

    def board_text(self, view: int = 0) -> str:
        g = self.grid
        cols = range(COLS - 1, -1, -1) if view else range(COLS)
        rows = ["".join(g[c * ROWS + r] for c in cols) for r in range(ROWS - 1, -1, -1)]
        return "\n".join(rows) + "\n1234567"

    def symmetries(self) -> int:
        """How many views `observation` and `view_action` / `board_action` know (2)."""
        return 2

    def view_action(self, action: str, view: int) -> str:
        """The board's column ``action`` as named in view ``view`` (1: mirrored)."""
        return COLUMNS[COLS - int(action)] if view else action

    def board_action(self, action: str, view: int) -> str:
        """The column named ``action`` in view ``view``, as the board's column."""
        return self.view_action(action, view)  # the mirror is its own inverse

    def observation(self, seat: int, view: int = 0) -> str:
        """What ``seat`` sees, through view ``view`` of the board (0: as it is)."""
        self._check_seat(seat)
        head = f"{self.board_text(view)}\nYou are {MARKS[seat]}."
        if self.done:
            return head + (" Game over: draw." if self.winner is None
                           else f" Game over: {MARKS[self.winner]} wins.")
        if seat != self.turn:
            return head + f" Waiting for {MARKS[self.turn]}."
        legal = sorted(self.view_action(a, view) for a in self.legal_actions(seat))
        return head + f" Legal: {' '.join(legal)}"

    def _wins(self, col: int, row: int, mark: str) -> bool:
        g = self.grid
        for dc, dr in _DIRS:
            n = 1
            for sign in (1, -1):
                c, r = col + sign * dc, row + sign * dr
                while 0 <= c < COLS and 0 <= r < ROWS and g[c * ROWS + r] == mark:
                    n += 1
                    c += sign * dc
                    r += sign * dr
            if n >= 4:
                return True
        return False

    def step(self, action: str) -> StepResult:
        if self.done or action not in COLUMNS or self.height[int(action) - 1] >= ROWS:
            raise self._illegal(action)
        col = int(action) - 1
        row = self.height[col]
        mark = MARKS[self.turn]
        self.grid[col * ROWS + row] = mark
        self.height[col] = row + 1
        self.moves += 1
        won = self._wins(col, row, mark)
        return self._after_move(won, self.moves == COLS * ROWS)

    def state_key(self) -> str:
        return "".join(self.grid)


@register_env("connect_four", family="game", source="classic; rules as OpenSpiel connect_four")
def make_connect_four(canonical: bool = False) -> Env:
    """Connect Four 7x6; ``canonical``: every seat sees the board as it is or mirrored,
    whichever text sorts first, and names its columns in it
    (`sparring.envs.views.CanonicalViews`)."""
    game = ConnectFour()
    return CanonicalViews(game, shared_view_memo(("connect_four",))) if canonical else game
