"""Single-turn verifiable arithmetic: the RL-with-verifiable-rewards case.

* ``arithmetic``: compute ``a op b op c`` (ops from ``+ - *``, operands with ``digits``
  digits, usual precedence). Answer: a number (in ``<answer>...</answer>``, else the last
  number in the text). Reward ``r = 1[answer == exact value]``.
* ``countdown``: reach ``target`` with some of the given ``numbers`` (each at most once)
  and ``+ - * /`` and parentheses (the Countdown task of TinyZero / "Stream of Search",
  Gandhi et al. 2024). Answer: the expression (answer tag, else the last non-empty line;
  a trailing ``= n`` is ignored). Reward ``r = 1[value(expr) == target]``. An expression
  using a number not on offer is *illegal*; text that is no expression is *unparsable*.
  Every target is built from the numbers, so every instance is solvable.

One seat, one step; ``info["correct"]`` says whether the answer was right (the
`TryAgain` wrapper reads it).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from fractions import Fraction

from sparring.envs import register_env
from sparring.envs.base import ParseResult, StepResult
from sparring.envs.parsing import answer_span, clean
from sparring.envs.tasks.safe_eval import UnsafeExpression, format_number, literals, safe_eval

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
MAX_DIGITS = 60


def parse_number(text: object) -> ParseResult:
    """The answer tag's last number, else the text's last number, as a canonical string."""
    t = clean(text)
    span = answer_span(t)
    found = _NUMBER.findall(span if span is not None else t)
    if not found:
        return ParseResult("unparsable", error="no number found; answer like <answer>42</answer>")
    raw = found[-1]
    if len(raw) > MAX_DIGITS:
        return ParseResult("unparsable", error=f"number longer than {MAX_DIGITS} digits")
    return ParseResult("legal", action=format_number(Fraction(raw)))


class _SingleTurn:
    """Shared plumbing of one-seat, one-step tasks."""

    num_seats = 1
    name = ""
    outcome_keys = ("correct",)

    def __init__(self) -> None:
        self._done = False
        self._ret = 0.0

    def current_seat(self) -> int | None:
        return None if self._done else 0

    def legal_actions(self, seat: int) -> list[str] | None:
        return None

    def returns(self) -> list[float]:
        return [self._ret]

    def _finish(self, correct: bool, action: str, answer: str) -> StepResult:
        if self._done:
            raise RuntimeError(f"{self.name}: step() after the episode ended; call reset(seed)")
        self._done = True
        self._ret = 1.0 if correct else 0.0
        return StepResult([self._ret], True, {"correct": correct, "answer": answer,
                                              "given": action})


class Arithmetic(_SingleTurn):
    """``a op b [op c ...]``; see the module docstring."""

    name = "arithmetic"

    def __init__(self, digits: int = 2, terms: int = 2, ops: str = "+-*"):
        super().__init__()
        if not 1 <= digits <= 12:
            raise ValueError(f"arithmetic: digits={digits}; must be in 1..12")
        if not 2 <= terms <= 6:
            raise ValueError(f"arithmetic: terms={terms}; must be in 2..6")
        if not ops or set(ops) - set("+-*"):
            raise ValueError(f"arithmetic: ops={ops!r}; use a non-empty subset of '+-*'")
        self.digits, self.terms, self.ops = digits, terms, ops
        self.reset(0)

    def reset(self, seed: int) -> None:
        rng = random.Random(seed)
        lo, hi = 10 ** (self.digits - 1), 10**self.digits - 1
        parts = [str(rng.randint(lo, hi))]
        for _ in range(self.terms - 1):
            parts += [rng.choice(self.ops), str(rng.randint(lo, hi))]
        self.problem = " ".join(parts)
        self.answer = safe_eval(self.problem)
        self._done, self._ret = False, 0.0

    def system_prompt(self, seat: int) -> str:
        return "Compute the value. Reply with the number in <answer></answer>."

    def observation(self, seat: int) -> str:
        return f"{self.problem} = ?"

    def parse(self, seat: int, text: str) -> ParseResult:
        return parse_number(text)

    def step(self, action: str) -> StepResult:
        p = parse_number(action)
        if not p.ok:
            raise ValueError(f"arithmetic: step() needs a number, got {action!r:.60}")
        return self._finish(Fraction(p.action) == self.answer, p.action,
                            format_number(self.answer))

    def state_key(self) -> str:
        return f"{self.problem}|{int(self._done)}"


class Countdown(_SingleTurn):
    """Reach the target with the given numbers; see the module docstring."""

    name = "countdown"

    def __init__(self, n_numbers: int = 4, max_number: int = 20, max_target: int = 100):
        super().__init__()
        if not 2 <= n_numbers <= 8:
            raise ValueError(f"countdown: n_numbers={n_numbers}; must be in 2..8")
        if not 2 <= max_number <= 1000:
            raise ValueError(f"countdown: max_number={max_number}; must be in 2..1000")
        if max_target < 2:
            raise ValueError(f"countdown: max_target={max_target}; must be >= 2")
        self.n_numbers, self.max_number, self.max_target = n_numbers, max_number, max_target
        self.reset(0)

    def reset(self, seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(100_000):
            numbers = [rng.randint(1, self.max_number) for _ in range(self.n_numbers)]
            k = rng.randint(2, self.n_numbers)
            used = rng.sample(numbers, k)
            value, expr = used[0], str(used[0])
            for b in used[1:]:
                op = rng.choice("+-*/")
                if op == "-" and value <= b or op == "/" and value % b:
                    op = "+"
                value = {"+": value + b, "-": value - b, "*": value * b, "/": value // b}[op]
                expr = f"({expr} {op} {b})"
            if 1 <= value <= self.max_target and value not in numbers:
                break
        else:
            raise ValueError(f"countdown: no target in 1..{self.max_target} found; "
                             "raise max_target")
        self.numbers, self.target, self.solution = numbers, value, expr[1:-1]
        self._done, self._ret = False, 0.0

    def system_prompt(self, seat: int) -> str:
        return ("Use some of the numbers, each at most once, with + - * / and parentheses "
                "to make the target. Reply with the expression in <answer></answer>.")

    def observation(self, seat: int) -> str:
        return f"numbers {' '.join(map(str, self.numbers))} target {self.target}"

    def parse(self, seat: int, text: str) -> ParseResult:
        t = clean(text)
        span = answer_span(t)
        if span is None:
            lines = [ln for ln in t.splitlines() if ln.strip()]
            span = lines[-1] if lines else ""
        expr = " ".join(span.split("=")[0].split())
        if not expr:
            return ParseResult("unparsable", error="empty answer")
        try:
            used = literals(expr)
        except UnsafeExpression as e:
            return ParseResult("unparsable", error=f"not a valid expression: {e}")
        left = Counter(Fraction(n) for n in self.numbers)
        for x in used:
            if left[x] <= 0:
                return ParseResult("illegal", error=f"{format_number(x)} is not available "
                                   f"(numbers: {' '.join(map(str, self.numbers))})")
            left[x] -= 1
        return ParseResult("legal", action=expr)

    def step(self, action: str) -> StepResult:
        p = self.parse(0, action)
        if not p.ok:
            raise ValueError(f"countdown: step() needs a legal expression: {p.error}")
        try:
            correct = safe_eval(p.action) == self.target
        except UnsafeExpression:  # e.g. division by zero: a legal but wrong answer
            correct = False
        return self._finish(correct, p.action, self.solution)

    def state_key(self) -> str:
        return f"{self.numbers}->{self.target}|{int(self._done)}"


@register_env("arithmetic", family="task", source="RLVR arithmetic (verifiable reward)")
def make_arithmetic(**options) -> Arithmetic:
    return Arithmetic(**options)


@register_env("countdown", family="task", source="Countdown (Gandhi et al. 2024; TinyZero)")
def make_countdown(**options) -> Countdown:
    return Countdown(**options)
