"""Tic-tac-toe: two seats, X (seat 0) moves first; actions are cells "1".."9" row by row.

Rewards at the end only: +1 win, -1 loss, 0 draw. No chance: ``reset(seed)`` gives the
empty board for every seed. Rules as in OpenSpiel's ``tic_tac_toe`` (cell k <-> action k-1).
"""

from __future__ import annotations

from sparring.envs import register_env
from sparring.envs.base import StepResult
from sparring.envs.games.common import TwoPlayerBoardGame

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
_LINES_THROUGH = tuple(tuple(ln for ln in LINES if c in ln) for c in range(9))
MARKS = ("X", "O")
CELLS = tuple(str(i) for i in range(1, 10))


class TicTacToe(TwoPlayerBoardGame):
    name = "tictactoe"
    num_seats = 2
    ALL_ACTIONS = CELLS

    def __init__(self, compact: bool = False) -> None:
        self.compact = bool(compact)
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
        self._check_seat(seat)
        return (f"Tic-tac-toe. You are {MARKS[seat]}; X moves first. Cells are numbered\n"
                "123\n456\n789\nGet three in a row. Reply with one cell, e.g. <answer>5</answer>.")

    def observation(self, seat: int) -> str:
        self._check_seat(seat)
        b = "".join(self.board)
        if self.compact and not self.done and seat == self.turn:
            return f"{MARKS[seat]} {b}"  # the mover's mark, then cells 1-9 in order
        rows = f"{b[0:3]}\n{b[3:6]}\n{b[6:9]}\n"
        if self.done:
            end = "Draw." if self.winner is None else f"{MARKS[self.winner]} wins."
            return rows + f"You are {MARKS[seat]}. Game over: {end}"
        if seat != self.turn:
            return rows + f"You are {MARKS[seat]}. Waiting for {MARKS[self.turn]}."
        return rows + f"You are {MARKS[seat]}. Legal: {' '.join(self.legal_actions(seat))}"

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


@register_env("tictactoe", family="game", source="classic; rules as OpenSpiel tic_tac_toe",
              aliases=("tic_tac_toe",))
def make_tictactoe(compact: bool = False) -> TicTacToe:
    """Tic-tac-toe; ``compact``: the mover sees only its mark and cells 1-9 in order
    (``"O X...O.X.."``), for tiny models."""
    return TicTacToe(compact=compact)
