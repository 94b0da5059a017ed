"""Kuhn poker for 2 or 3 players (Kuhn, 1950; 3-player: Szafron et al., 2013).

Deck of N+1 cards (J<Q<K, plus A for 3 players); everyone antes 1 chip and gets one card.
Seats act in order with "pass" or "bet" (1 chip). Before any bet, "pass" checks; once
someone bets, every other seat acts once more: "bet" calls, "pass" folds. Showdown: the
highest card among the seats that bet (or among all, if nobody bet) takes the pot.
Returns are zero-sum chips: pot - own stake for the winner, -own stake for the others.
Rules as OpenSpiel's ``kuhn_poker`` (card k <-> chance outcome k, pass/bet <-> 0/1).

Information state (for CFR and exploitability): ``"<card>|<history>"``, e.g. ``"K|pb"``.
"""

from __future__ import annotations

import itertools
import random

from sparring.envs import register_env
from sparring.envs.base import StepResult
from sparring.envs.games.common import ChoiceGame

RANKS = "JQKA"
ACTIONS = ("pass", "bet")


class KuhnPoker(ChoiceGame):
    name = "kuhn_poker"
    ALL_ACTIONS = ACTIONS

    def __init__(self, players: int = 2, compact: bool = False) -> None:
        if players not in (2, 3):
            raise ValueError(f"kuhn_poker: players must be 2 or 3, got {players!r}")
        self.num_seats = players
        self.compact = bool(compact)
        self.reset(0)

    # --- chance -------------------------------------------------------------
    def deal_outcomes(self) -> list[tuple[int, ...]]:
        """Every ordered deal (card of seat 0, 1, ...), all equally likely."""
        return list(itertools.permutations(range(self.num_seats + 1), self.num_seats))

    def reset(self, seed: int = 0) -> None:
        self.seed = seed
        self.reset_deal(tuple(random.Random(seed).sample(range(self.num_seats + 1), self.num_seats)))

    def reset_deal(self, deal: tuple[int, ...]) -> None:
        """Start a hand with the given cards (one per seat, distinct, in 0..N)."""
        n = self.num_seats
        if len(deal) != n or len(set(deal)) != n or not all(0 <= c <= n for c in deal):
            raise ValueError(f"kuhn_poker: bad deal {deal!r} for {n} players")
        self.cards = tuple(deal)
        self.history: list[str] = []
        self.stake = [1] * n
        self.first_bettor: int | None = None
        self.done = False
        self._returns = [0.0] * n

    # --- protocol -----------------------------------------------------------
    def current_seat(self) -> int | None:
        return None if self.done else len(self.history) % self.num_seats

    def legal_actions(self, seat: int) -> list[str]:
        return list(ACTIONS) if seat == self.current_seat() else []

    def system_prompt(self, seat: int) -> str:
        self._check_seat(seat)
        n = self.num_seats
        return (f"Kuhn poker, {n} players, cards {'<'.join(RANKS[:n + 1])}. Each player antes 1 "
                "chip and gets one card. In turn: pass or bet 1 chip. After a bet, bet = call "
                "and pass = fold. The highest card still in wins the pot. You are "
                f"P{seat}. Reply <answer>pass</answer> or <answer>bet</answer>.")

    def observation(self, seat: int) -> str:
        self._check_seat(seat)
        moves = ", ".join(f"P{i % self.num_seats} {h}" for i, h in
                          enumerate("pass" if c == "p" else "bet" for c in self.history))
        head = f"You are P{seat}. Card: {RANKS[self.cards[seat]]}. Pot: {sum(self.stake)}. " \
               f"Moves: {moves or '-'}."
        if self.compact and not self.done and seat == self.current_seat():
            # card, then the moves so far (p = pass, b = bet): what a tiny model reads best
            return f"{RANKS[self.cards[seat]]} {''.join(self.history) or '-'}"
        if self.done:
            shown = " ".join(f"P{i}={RANKS[c]}" for i, c in enumerate(self.cards))
            return f"{head} Over: {shown}. You got {self._returns[seat]:+g}."
        if seat != self.current_seat():
            return f"{head} Waiting for P{self.current_seat()}."
        return f"{head} Legal: pass bet"

    def info_state(self, seat: int) -> str:
        return f"{RANKS[self.cards[seat]]}|{''.join(self.history)}"

    def tree_options(self) -> dict[str, int]:
        """The options its game tree depends on (``compact`` changes only the text)."""
        return {"players": self.num_seats}

    def step(self, action: str) -> StepResult:
        if self.done or action not in ACTIONS:
            raise self._illegal(action)
        n = self.num_seats
        seat = len(self.history) % n
        if action == "bet":
            self.stake[seat] += 1
            if self.first_bettor is None:
                self.first_bettor = seat
        self.history.append(action[0])
        h = len(self.history)
        if (self.first_bettor is None and h == n) or (self.first_bettor is not None and
                                                      h == n + self.first_bettor):
            return self._showdown()
        return StepResult([0.0] * n, False, {})

    def _showdown(self) -> StepResult:
        n = self.num_seats
        if self.first_bettor is None:
            live = range(n)
        else:
            live = [s for s in range(n) if self.stake[s] == 2]
        winner = max(live, key=lambda s: self.cards[s])
        pot = sum(self.stake)
        rewards = [float((pot if s == winner else 0) - self.stake[s]) for s in range(n)]
        self.done = True
        self._returns = rewards
        return StepResult(list(rewards), True, {"winner": winner})

    def state_key(self) -> str:
        return "".join(RANKS[c] for c in self.cards) + "|" + "".join(self.history)


@register_env("kuhn_poker", family="game", source="Kuhn (1950); rules as OpenSpiel kuhn_poker",
              game_tree=True)
def make_kuhn_poker(players: int = 2, compact: bool = False) -> KuhnPoker:
    """Kuhn poker; ``players``: 2 or 3; ``compact``: the acting seat sees only its card and
    the moves so far (``"K pb"``), for tiny models."""
    return KuhnPoker(players=players, compact=compact)
