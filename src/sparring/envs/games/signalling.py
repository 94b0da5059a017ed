"""A Lewis signalling game: cooperation through a private channel.

Each round the sender (seat 0) sees a secret, one of ``k`` colours drawn uniformly, and
sends one of ``k`` abstract symbols; the receiver (seat 1) sees only the symbol and
guesses a colour. Both seats get ``+1`` when the guess is the secret, else 0, so the
reward is shared: ``r_0 = r_1 = 1[guess == secret]``. Without a convention the receiver
is right with probability ``1/k``; a bijective convention (sender maps colours to
symbols, receiver inverts it) is right every time. ``rounds`` rounds make one episode
(secrets drawn from the seed); each seat sees the last round's outcome.
Source: Lewis, "Convention" (1969); emergent-communication RL (e.g. Lazaridou et al. 2017).
"""

from __future__ import annotations

import random

from sparring.envs import register_env
from sparring.envs.base import ParseResult, StepResult
from sparring.envs.parsing import parse_choice

COLOURS = ("red", "green", "blue", "yellow", "purple", "orange", "white", "black")
SYMBOLS = ("zib", "mog", "tup", "vex", "kal", "dro", "fen", "wum")


class Signalling:
    """See the module docstring."""

    name = "signalling"
    num_seats = 2

    def __init__(self, k: int = 4, rounds: int = 1):
        if not 2 <= k <= len(COLOURS):
            raise ValueError(f"signalling: k={k}; must be in 2..{len(COLOURS)}")
        if not 1 <= rounds <= 100:
            raise ValueError(f"signalling: rounds={rounds}; must be in 1..100")
        self.k, self.rounds = k, rounds
        self.colours, self.symbols = list(COLOURS[:k]), list(SYMBOLS[:k])
        self.reset(0)

    def reset(self, seed: int) -> None:
        rng = random.Random(seed)
        self.secrets = [rng.choice(self.colours) for _ in range(self.rounds)]
        self.round, self.symbol, self.last = 0, None, None  # last: (symbol, guess, secret)
        self._done, self._ret = False, [0.0, 0.0]

    def current_seat(self) -> int | None:
        if self._done:
            return None
        return 0 if self.symbol is None else 1

    def system_prompt(self, seat: int) -> str:
        if seat == 0:
            return (f"You are the sender. You see a secret colour and send one symbol "
                    f"({', '.join(self.symbols)}) to your partner, who must guess the colour. "
                    "You both score when the guess is right.")
        return (f"You are the receiver. You see your partner's symbol and guess the secret "
                f"colour ({', '.join(self.colours)}). You both score when you are right.")

    def observation(self, seat: int) -> str:
        lines = []
        if self.last is not None:
            sym, guess, secret = self.last
            lines.append(f"last: {sym} -> {guess} ({'right' if guess == secret else 'wrong'})")
        lines.append(f"round {min(self.round + 1, self.rounds)}/{self.rounds}")
        if not self._done:
            if seat == 0 and self.symbol is None:
                lines.append(f"secret: {self.secrets[self.round]}")
            elif seat == 1 and self.symbol is not None:
                lines.append(f"symbol: {self.symbol}")
        return "\n".join(lines)

    def legal_actions(self, seat: int) -> list[str] | None:
        if seat != self.current_seat():
            return []
        return list(self.symbols if seat == 0 else self.colours)

    def parse(self, seat: int, text: str) -> ParseResult:
        legal = self.legal_actions(seat)
        if not legal:
            return ParseResult("illegal", error="it is not your turn")
        return parse_choice(text, legal, self.symbols + self.colours)

    def step(self, action: str) -> StepResult:
        seat = self.current_seat()
        if seat is None:
            raise RuntimeError("signalling: step() after the episode ended; call reset(seed)")
        if action not in self.legal_actions(seat):
            raise ValueError(f"signalling: {action!r:.40} is not legal for seat {seat}; "
                             f"legal: {', '.join(self.legal_actions(seat))}")
        if seat == 0:
            self.symbol = action
            return StepResult([0.0, 0.0], False)
        secret = self.secrets[self.round]
        r = 1.0 if action == secret else 0.0
        self.last = (self.symbol, action, secret)
        self.round, self.symbol = self.round + 1, None
        self._done = self.round >= self.rounds
        self._ret = [x + r for x in self._ret]
        return StepResult([r, r], self._done, {"secret": secret, "correct": r == 1.0})

    def state_key(self) -> str:
        # what the acting seat knows: the sender's secret, or the receiver's symbol
        secret = self.secrets[self.round] if not self._done and self.symbol is None else "-"
        return f"{self.round}|{secret}|{self.symbol}|{self.last}"

    def returns(self) -> list[float]:
        return list(self._ret)


@register_env("signalling", family="cooperative", source="Lewis signalling game (Lewis 1969)")
def make_signalling(**options) -> Signalling:
    return Signalling(**options)
