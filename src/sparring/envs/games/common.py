"""Shared plumbing for finite-action games: parsing, returns and cheap clones."""

from __future__ import annotations

from sparring.envs.base import ParseResult, StepResult
from sparring.envs.parsing import parse_choice


def _copied(value):
    """A list copied, and one level of lists nested in it; anything else as it is."""
    if not isinstance(value, list):
        return value
    return [list(x) if isinstance(x, list) else x for x in value]


class ChoiceGame:
    """Base for games whose actions are a finite set of strings (``ALL_ACTIONS``).

    Subclasses set ``name``, ``num_seats``, ``ALL_ACTIONS`` and keep ``self._returns``
    (cumulative reward per seat). ``clone()`` copies the state for search bots.
    """

    name: str = ""
    num_seats: int = 2
    ALL_ACTIONS: tuple[str, ...] = ()

    def parse(self, seat: int, text: object) -> ParseResult:
        """Raw model text -> legal / illegal / unparsable. Never raises."""
        try:
            legal = self.legal_actions(seat) or []
        except Exception:  # a bad seat number: nothing is legal for it
            legal = []
        return parse_choice(text, legal, list(self.ALL_ACTIONS))

    def returns(self) -> list[float]:
        return list(self._returns)

    def clone(self):
        """An independent copy of the current state (lists are copied, not shared)."""
        new = object.__new__(type(self))  # what copy.copy makes, without its protocol lookups
        new.__dict__ = {k: _copied(v) for k, v in self.__dict__.items()}
        return new

    def _check_seat(self, seat: int) -> None:
        if not isinstance(seat, int) or not 0 <= seat < self.num_seats:
            raise ValueError(f"{self.name}: seat must be an int in [0, {self.num_seats}), got {seat!r}")

    def _illegal(self, action: str) -> ValueError:
        seat = self.current_seat()
        legal = self.legal_actions(seat) if seat is not None else []
        return ValueError(f"{self.name}: illegal action {action!r} for seat {seat}; "
                          f"legal: {', '.join(legal) or '(game over)'}")


class TwoPlayerBoardGame(ChoiceGame):
    """A two-seat alternating game: ``self.turn`` (0 or 1) is the seat to move."""

    def current_seat(self) -> int | None:
        return None if self.done else self.turn

    def _after_move(self, won: bool, board_full: bool) -> StepResult:
        """End the game (+1 / -1 for a win, 0 for a draw) or pass the move on."""
        if won or board_full:
            self.done = True
            if won:
                self.winner = self.turn
                rewards = [1.0, -1.0] if self.turn == 0 else [-1.0, 1.0]
            else:
                rewards = [0.0, 0.0]
            self._returns = rewards
            return StepResult(list(rewards), True, {"winner": self.winner})
        self.turn ^= 1
        return StepResult([0.0, 0.0], False, {})
