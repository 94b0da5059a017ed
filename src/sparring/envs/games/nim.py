"""Nim: heaps of stones; a move takes k >= 1 stones from one heap, written "heap:k"
(heaps numbered from 1, e.g. "2:3" takes 3 from heap 2). Seat 0 moves first.

Normal play (default): whoever takes the last stone wins (+1 / -1). Misere
(``misere=True``, OpenSpiel's default): whoever takes the last stone loses.
Bouton (1901): under normal play the player to move wins iff the XOR of the heap sizes is
non-zero. Rules as OpenSpiel's ``nim`` (``pile_sizes``, ``is_misere``).
"""

from __future__ import annotations

from sparring.envs import register_env
from sparring.envs.base import StepResult
from sparring.envs.games.common import TwoPlayerBoardGame


class Nim(TwoPlayerBoardGame):
    name = "nim"
    num_seats = 2

    def __init__(self, heaps: tuple[int, ...] | list[int] = (1, 3, 5, 7), misere: bool = False) -> None:
        heaps = tuple(heaps)
        if not heaps or len(heaps) > 9 or not all(isinstance(h, int) and 0 <= h <= 99 for h in heaps) \
                or sum(heaps) == 0:
            raise ValueError(f"nim: heaps must be 1-9 ints in 0..99, not all zero; got {heaps!r}")
        self.initial = heaps
        self.misere = bool(misere)
        self.ALL_ACTIONS = tuple(f"{i + 1}:{k}" for i, h in enumerate(heaps) for k in range(1, h + 1))
        self.reset(0)

    def reset(self, seed: int = 0) -> None:
        self.seed = seed
        self.heaps = list(self.initial)
        self.turn = 0
        self.done = False
        self._returns = [0.0, 0.0]

    def legal_actions(self, seat: int) -> list[str]:
        if self.done or seat != self.turn:
            return []
        return [f"{i + 1}:{k}" for i, h in enumerate(self.heaps) for k in range(1, h + 1)]

    def system_prompt(self, seat: int) -> str:
        self._check_seat(seat)
        goal = "loses" if self.misere else "wins"
        return (f"Nim. Players alternate taking 1 or more stones from one heap. Whoever takes "
                f"the last stone {goal}. You are P{seat}. Write a move as heap:count, e.g. "
                "<answer>2:3</answer> takes 3 stones from heap 2.")

    def observation(self, seat: int) -> str:
        self._check_seat(seat)
        head = f"Heaps: {' '.join(map(str, self.heaps))}. You are P{seat}."
        if self.done:
            return head + f" Game over: you got {self._returns[seat]:+g}."
        if seat != self.turn:
            return head + f" Waiting for P{self.turn}."
        return head + f" Legal: {' '.join(self.legal_actions(seat))}"

    def step(self, action: str) -> StepResult:
        try:
            h, k = (int(x) for x in action.split(":"))
        except (ValueError, AttributeError):
            h = k = 0
        if self.done or not (1 <= h <= len(self.heaps) and 1 <= k <= self.heaps[h - 1]):
            raise self._illegal(action)
        self.heaps[h - 1] -= k
        if sum(self.heaps) == 0:
            self.done = True
            mover_wins = not self.misere
            win = self.turn if mover_wins else 1 - self.turn
            rewards = [1.0, -1.0] if win == 0 else [-1.0, 1.0]
            self._returns = rewards
            return StepResult(list(rewards), True, {"winner": win})
        self.turn ^= 1
        return StepResult([0.0, 0.0], False, {})

    def state_key(self) -> str:
        return f"{'m' if self.misere else 'n'}{self.turn}|" + ",".join(map(str, self.heaps))


@register_env("nim", family="game", source="Bouton (1901); rules as OpenSpiel nim")
def make_nim(heaps: tuple[int, ...] | list[int] = (1, 3, 5, 7), misere: bool = False) -> Nim:
    """Nim; ``heaps``: initial heap sizes; ``misere``: last stone loses."""
    return Nim(heaps=heaps, misere=misere)
