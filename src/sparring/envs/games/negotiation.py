"""Deal or no deal: two seats with private valuations split a pool of items.

The pool has 3 item types (book, hat, ball) with counts ``n_t`` in 1..3. Each seat ``i``
has private values ``v_i,t`` in ``0..max_value`` with the same total
``sum_t n_t v_i,t = total`` (10 by default), every item type is worth something to some
seat (the setting of Lewis et al. 2017, "Deal or No Deal? End-to-End Learning for
Negotiation Dialogues"; here with structured moves instead of dialogue).

Seats alternate, seat 0 first. A move is ``propose a b c`` (the mover keeps ``a`` books,
``b`` hats, ``c`` balls; the other seat gets the rest) or ``accept`` (the last proposal,
made by the other seat). On ``accept`` the episode ends and seat ``i`` earns
``r_i = sum_t v_i,t * share_i,t`` (divided by ``total`` when ``normalize``). When
``max_turns`` moves pass without an accept there is no deal: ``r_i = 0`` for both.
"""

from __future__ import annotations

import itertools
import random
import re

from sparring.envs import register_env
from sparring.envs.base import ParseResult, StepResult
from sparring.envs.parsing import answer_span, clean

ITEMS = ("book", "hat", "ball")
_MOVE = re.compile(r"\b(?:propose\s+(\d{1,3})\s+(\d{1,3})\s+(\d{1,3})|accept)\b")


def valuations(counts: tuple[int, ...], total: int, max_value: int) -> list[tuple[int, ...]]:
    """Every value vector ``v`` in ``0..max_value`` with ``sum(counts * v) == total``."""
    return [v for v in itertools.product(range(max_value + 1), repeat=len(counts))
            if sum(n * x for n, x in zip(counts, v)) == total]


class Negotiation:
    """See the module docstring."""

    name = "negotiation"
    num_seats = 2

    def __init__(self, total: int = 10, max_value: int = 5, max_turns: int = 6,
                 normalize: bool = True, counts: tuple[int, int, int] | None = None,
                 values: tuple[tuple[int, ...], tuple[int, ...]] | None = None):
        if max_turns < 2:
            raise ValueError(f"negotiation: max_turns={max_turns}; must be >= 2")
        if total < 1 or max_value < 1:
            raise ValueError("negotiation: total and max_value must be >= 1")
        if (counts is None) != (values is None):
            raise ValueError("negotiation: give both counts and values (a fixed game) or neither")
        if counts is not None:
            bad = [v for v in values if len(v) != 3 or sum(n * x for n, x in zip(counts, v)) != total]
            if len(counts) != 3 or min(counts) < 1 or len(values) != 2 or bad:
                raise ValueError(f"negotiation: values {values} must be two 3-vectors worth "
                                 f"total={total} for counts={counts}")
        self.total, self.max_value, self.max_turns = total, max_value, max_turns
        self.normalize = normalize
        self.fixed = (tuple(counts), tuple(map(tuple, values))) if counts is not None else None
        self.reset(0)

    def reset(self, seed: int) -> None:
        rng = random.Random(seed)
        if self.fixed is not None:
            self.counts, self.values = self.fixed
        else:
            self.counts, self.values = self._draw(rng)
        self.turn, self.offer, self.deal = 0, None, None  # offer: (mover, kept)
        self._done, self._ret = False, [0.0, 0.0]
        self._all = [f"propose {a} {b} {c}" for a in range(self.counts[0] + 1)
                     for b in range(self.counts[1] + 1) for c in range(self.counts[2] + 1)]

    def _draw(self, rng: random.Random):
        for _ in range(10_000):
            counts = tuple(rng.randint(1, 3) for _ in ITEMS)
            options = valuations(counts, self.total, self.max_value)
            if not options:
                continue
            v0, v1 = rng.choice(options), rng.choice(options)
            if all(a or b for a, b in zip(v0, v1)):
                return counts, (v0, v1)
        raise ValueError(f"negotiation: no valuations worth total={self.total} with "
                         f"values <= {self.max_value}")

    def current_seat(self) -> int | None:
        return None if self._done else self.turn % 2

    def system_prompt(self, seat: int) -> str:
        return ("Negotiate how to split the items. 'propose a b c' keeps a books, b hats, "
                "c balls for you and gives the rest to the other; 'accept' takes their last "
                f"offer. No deal after {self.max_turns} moves: both get 0.")

    def observation(self, seat: int) -> str:
        pool = " ".join(f"{n} {t}" for n, t in zip(self.counts, ITEMS))
        vals = " ".join(map(str, self.values[seat]))
        text = f"items: {pool}\nyour values: {vals}\nmove {self.turn + 1}/{self.max_turns}"
        if self.offer is not None:
            mover, kept = self.offer
            you = kept if mover == seat else tuple(n - k for n, k in zip(self.counts, kept))
            who = "you proposed" if mover == seat else "offer"
            text += f"\n{who}: you get {' '.join(map(str, you))}"
        return text

    def legal_actions(self, seat: int) -> list[str] | None:
        if self._done or seat != self.current_seat():
            return []
        return self._all + (["accept"] if self.offer is not None else [])

    def parse(self, seat: int, text: str) -> ParseResult:
        if self._done or seat != self.current_seat():
            return ParseResult("illegal", error="it is not your turn")
        t = clean(text)
        span = answer_span(t)
        found = list(_MOVE.finditer((span if span is not None else t).lower()))
        if not found:
            return ParseResult("unparsable", error="write 'propose a b c' (the books, hats "
                               "and balls you keep) or 'accept'")
        m = found[-1]
        if m.group(1) is None:
            if self.offer is None:
                return ParseResult("illegal", error="there is no offer to accept yet")
            return ParseResult("legal", action="accept")
        kept = [int(g) for g in m.groups()]
        if any(k > n for k, n in zip(kept, self.counts)):
            return ParseResult("illegal", error=f"you can keep at most "
                               f"{' '.join(map(str, self.counts))}")
        return ParseResult("legal", action="propose " + " ".join(map(str, kept)))

    def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError("negotiation: step() after the episode ended; call reset(seed)")
        seat = self.turn % 2
        if action not in self.legal_actions(seat):
            raise ValueError(f"negotiation: {action!r:.40} is not legal for seat {seat}")
        self.turn += 1
        if action == "accept":
            mover, kept = self.offer
            shares = [None, None]
            shares[mover] = kept
            shares[1 - mover] = tuple(n - k for n, k in zip(self.counts, kept))
            scale = self.total if self.normalize else 1
            rewards = [sum(v * s for v, s in zip(self.values[i], shares[i])) / scale
                       for i in range(2)]
            self.deal, self._done, self._ret = tuple(shares), True, rewards
            return StepResult(list(rewards), True, {"deal": True, "shares": shares})
        self.offer = (seat, tuple(int(x) for x in action.split()[1:]))
        self._done = self.turn >= self.max_turns
        return StepResult([0.0, 0.0], self._done, {"deal": False} if self._done else {})

    def state_key(self) -> str:
        return f"{self.counts}|{self.values}|{self.offer}|{self.turn}"

    def returns(self) -> list[float]:
        return list(self._ret)


@register_env("negotiation", family="cooperative",
              source="Deal or No Deal (Lewis et al. 2017)")
def make_negotiation(**options) -> Negotiation:
    return Negotiation(**options)
