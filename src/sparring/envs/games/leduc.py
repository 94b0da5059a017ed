"""Leduc hold'em (Southey et al., 2005): two players, deck J J Q Q K K (card c has rank c // 2).

Each antes 1 chip and gets a private card. Two betting rounds, seat 0 acts first in each;
actions "fold" (only when facing a bet), "call" (check when nothing is owed), "raise"
(bet size 2 in round 1, 4 in round 2; at most 2 raises per round). A round ends when a
call closes it (after at least two actions). A public card is then revealed. Showdown: a
pair with the public card wins, else the higher rank; equal ranks split the pot.
Returns are zero-sum chips. Rules as OpenSpiel's ``leduc_poker`` (fold/call/raise <-> 0/1/2).

Information state: ``"<private>|<public or empty>|<round-1 moves>/<round-2 moves>"`` with
moves f/c/r, e.g. ``"K|Q|rc/c"``.
"""

from __future__ import annotations

import itertools
import random

from sparring.envs import register_env
from sparring.envs.base import StepResult
from sparring.envs.games.common import ChoiceGame

RANKS = "JQK"
ACTIONS = ("fold", "call", "raise")
RAISE = (2, 4)


class Leduc(ChoiceGame):
    name = "leduc"
    num_seats = 2
    ALL_ACTIONS = ACTIONS

    def __init__(self, compact: bool = False) -> None:
        self.compact = bool(compact)
        self.reset(0)

    def deal_outcomes(self) -> list[tuple[int, int, int]]:
        """Every ordered deal (card of seat 0, seat 1, public card), all equally likely."""
        return list(itertools.permutations(range(6), 3))

    def reset(self, seed: int = 0) -> None:
        self.seed = seed
        self.reset_deal(tuple(random.Random(seed).sample(range(6), 3)))

    def tree_options(self) -> dict[str, int]:
        """The options its game tree depends on: none (``compact`` changes only the text)."""
        return {}

    def reset_deal(self, deal: tuple[int, int, int]) -> None:
        """Start a hand with cards (seat 0, seat 1, public); the public card shows in round 2."""
        if len(deal) != 3 or len(set(deal)) != 3 or not all(0 <= c < 6 for c in deal):
            raise ValueError(f"leduc: bad deal {deal!r}; need 3 distinct cards in 0..5")
        self.cards = tuple(deal)
        self.rounds: list[list[str]] = [[], []]
        self.round = 0
        self.stake = [1, 1]
        self.raises = 0
        self.seat = 0
        self.done = False
        self._returns = [0.0, 0.0]

    def current_seat(self) -> int | None:
        return None if self.done else self.seat

    def legal_actions(self, seat: int) -> list[str]:
        if self.done or seat != self.seat:
            return []
        out = ["fold"] if self.stake[1 - seat] > self.stake[seat] else []
        out.append("call")
        if self.raises < 2:
            out.append("raise")
        return out

    def system_prompt(self, seat: int) -> str:
        self._check_seat(seat)
        return ("Leduc poker, 2 players, deck J J Q Q K K. Each antes 1 and gets a private card. "
                "Two betting rounds (raise 2, then 4; max 2 raises a round), then a public card "
                "is shown after round 1. Pairing the public card wins, else higher card. You are "
                f"P{seat}. Reply <answer>fold</answer>, <answer>call</answer> or "
                "<answer>raise</answer>.")

    def public_card(self) -> int | None:
        return self.cards[2] if self.round == 1 else None

    def observation(self, seat: int) -> str:
        self._check_seat(seat)
        pub = self.public_card()
        words = {"f": "fold", "c": "call", "r": "raise"}
        hist = " / ".join(" ".join(words[m] for m in r) or "-" for r in self.rounds[: self.round + 1])
        head = (f"You are P{seat}. Card: {RANKS[self.cards[seat] // 2]}. Public: "
                f"{RANKS[pub // 2] if pub is not None else '-'}. Pot: {sum(self.stake)}. "
                f"Moves: {hist}.")
        if self.compact and not self.done and seat == self.seat:
            # private card, public card (- before it is dealt), moves per round (f/c/r)
            return (f"{RANKS[self.cards[seat] // 2]}{RANKS[pub // 2] if pub is not None else '-'}"
                    f" {'/'.join(''.join(r) or '-' for r in self.rounds[: self.round + 1])}")
        if self.done:
            return f"{head} Over. You got {self._returns[seat]:+g}."
        if seat != self.seat:
            return f"{head} Waiting for P{self.seat}."
        return f"{head} Legal: {' '.join(self.legal_actions(seat))}"

    def info_state(self, seat: int) -> str:
        pub = self.public_card()
        return (f"{RANKS[self.cards[seat] // 2]}|{RANKS[pub // 2] if pub is not None else ''}|"
                f"{''.join(self.rounds[0])}/{''.join(self.rounds[1])}")

    def step(self, action: str) -> StepResult:
        seat = self.seat
        if self.done or action not in self.legal_actions(seat):
            raise self._illegal(action)
        moves = self.rounds[self.round]
        moves.append(action[0])
        other = 1 - seat
        if action == "fold":
            return self._finish(winner=other)
        if action == "raise":
            self.stake[seat] = self.stake[other] + RAISE[self.round]
            self.raises += 1
        else:
            self.stake[seat] = self.stake[other]
            if len(moves) >= 2:  # a call closes the round
                if self.round == 1:
                    return self._showdown()
                self.round, self.raises, self.seat = 1, 0, 0
                return StepResult([0.0, 0.0], False, {})
        self.seat = other
        return StepResult([0.0, 0.0], False, {})

    def _showdown(self) -> StepResult:
        pub = self.cards[2] // 2
        r0, r1 = self.cards[0] // 2, self.cards[1] // 2
        s0 = (r0 == pub, r0)
        s1 = (r1 == pub, r1)
        return self._finish(winner=0 if s0 > s1 else 1 if s1 > s0 else None)

    def _finish(self, winner: int | None) -> StepResult:
        self.done = True
        if winner is None:
            rewards = [0.0, 0.0]
        else:
            won = float(self.stake[1 - winner])
            rewards = [won, -won] if winner == 0 else [-won, won]
        self._returns = rewards
        return StepResult(list(rewards), True, {"winner": winner})

    def state_key(self) -> str:
        c = self.cards
        return (f"{c[0]}{c[1]}{c[2]}|{''.join(self.rounds[0])}/{''.join(self.rounds[1])}")


@register_env("leduc", family="game", source="Southey et al. (2005); rules as OpenSpiel leduc_poker",
              aliases=("leduc_poker",), game_tree=True)
def make_leduc(compact: bool = False) -> Leduc:
    """Leduc hold'em; ``compact``: the acting seat sees only its card, the public card and
    the moves per round (``"KQ rc/r"``), for tiny models."""
    return Leduc(compact=compact)
