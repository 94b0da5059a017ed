"""A tool task: answer an arithmetic question, using a calculator tool if you like.

Each turn the agent emits either ``calc: <expr>`` (the tool: `safe_eval`, never
``eval``/``exec``; the expression ends at the line's end or at ``=``, so ``calc: 12 * 34 =``
asks for ``12 * 34``; the result or the tool's error is shown in the next observation) or
``answer: <n>`` (ends the episode). Questions are products and sums of 2-4 digit numbers,
too hard to do reliably in one's head, so the tool pays. At most ``max_calls`` tool
calls; after that only an answer is legal. ``action_prefixes`` names the two command
words (only ``answer:`` once the calls are spent): under constrained decoding the model
picks one and writes the rest freely.

The step that ends the episode reports ``correct``, ``calls``, ``used_tool`` (1 when at
least one call was made) and ``correct_without_tool`` (1 for a right answer given without
a call): their means are the accuracy, the calls per question, the tool-call rate and,
divided by one minus the tool-call rate, the accuracy of answers given without the tool.

Reward at the answer: ``r = 1[n == value] - tool_cost * calls`` and, with
``require_tool=True``, 0 when the answer came without any tool call.
The last ``calc:``/``answer:`` in the text (or in its answer tag) counts.
Tool-use RL setting in the spirit of ToolRL / ReTool (2025); the task itself is ours.
"""

from __future__ import annotations

import random
import re
from fractions import Fraction

from sparring.envs import register_env
from sparring.envs.base import ParseResult, StepResult
from sparring.envs.parsing import answer_span, clean
from sparring.envs.tasks.arithmetic import parse_number
from sparring.envs.tasks.safe_eval import UnsafeExpression, format_number, safe_eval

_CMD = re.compile(r"\b(calc|answer)\s*:", re.IGNORECASE)
_SHAPES = ("{a} * {b} + {c}", "{a} * {b} - {c}", "({a} + {b}) * {c}", "{a} * {b} * {c}",
           "{a} * {b} + {c} * {d}")


class Calculator:
    """See the module docstring."""

    name = "calculator"
    num_seats = 1
    outcome_keys = ("correct", "calls", "used_tool", "correct_without_tool")

    def __init__(self, max_calls: int = 3, require_tool: bool = False, tool_cost: float = 0.0,
                 digits: int = 3):
        if max_calls < 1:
            raise ValueError(f"calculator: max_calls={max_calls}; must be >= 1")
        if not 1 <= digits <= 6:
            raise ValueError(f"calculator: digits={digits}; must be in 1..6")
        if tool_cost < 0:
            raise ValueError(f"calculator: tool_cost={tool_cost}; must be >= 0")
        self.max_calls, self.require_tool = max_calls, require_tool
        self.tool_cost, self.digits = tool_cost, digits
        self.reset(0)

    def reset(self, seed: int) -> None:
        rng = random.Random(seed)
        lo, hi = 10 ** (self.digits - 1), 10**self.digits - 1
        nums = {k: rng.randint(max(2, lo), hi) for k in "abcd"}
        self.question = rng.choice(_SHAPES).format(**nums)
        self.value = safe_eval(self.question)
        self.calls: list[tuple[str, str]] = []  # (expression, shown result)
        self._done, self._ret = False, 0.0

    def current_seat(self) -> int | None:
        return None if self._done else 0

    def system_prompt(self, seat: int) -> str:
        return (f"Answer the question. You may use a calculator up to {self.max_calls} times: "
                "write 'calc: <expression>' to see its value. Finish with 'answer: <number>'.")

    def observation(self, seat: int) -> str:
        lines = [f"Q: {self.question} = ?"]
        lines += [f"calc: {e} -> {r}" for e, r in self.calls]
        lines.append(f"calls left: {self.max_calls - len(self.calls)}")
        return "\n".join(lines)

    def legal_actions(self, seat: int) -> list[str] | None:
        return None

    def action_prefixes(self, seat: int) -> list[str]:
        return ["calc:", "answer:"] if len(self.calls) < self.max_calls else ["answer:"]

    def parse(self, seat: int, text: str) -> ParseResult:
        t = clean(text)
        span = answer_span(t)
        hay = span if span is not None else t
        found = list(_CMD.finditer(hay))
        if not found:
            if span is not None:  # a bare <answer>n</answer> is an answer
                p = parse_number(span)
                return ParseResult("legal", action=f"answer: {p.action}") if p.ok else p
            return ParseResult("unparsable", error="write 'calc: <expression>' or 'answer: <number>'")
        last = found[-1]
        kind, arg = last.group(1).lower(), hay[last.end():].split("\n", 1)[0].strip()
        if kind == "calc":
            arg = arg.split("=", 1)[0].strip()  # "calc: 12 * 34 = ..." asks for 12 * 34
            if not arg:
                return ParseResult("unparsable", error="empty calc expression")
            if len(self.calls) >= self.max_calls:
                return ParseResult("illegal", error="no calculator calls left; write 'answer: <number>'")
            return ParseResult("legal", action=f"calc: {' '.join(arg.split())}")
        p = parse_number(arg)
        if not p.ok:
            return ParseResult("unparsable", error="answer must be a number, e.g. 'answer: 42'")
        return ParseResult("legal", action=f"answer: {p.action}")

    def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError("calculator: step() after the episode ended; call reset(seed)")
        p = self.parse(0, action)
        if not p.ok:
            raise ValueError(f"calculator: step() needs a legal action: {p.error}")
        kind, arg = p.action.split(": ", 1)
        if kind == "calc":
            try:
                shown = format_number(safe_eval(arg))
            except UnsafeExpression as e:
                shown = f"error: {e}"
            self.calls.append((arg, shown))
            return StepResult([0.0], False, {"tool": "calc", "result": shown})
        correct = Fraction(arg) == self.value and (self.calls or not self.require_tool)
        reward = (1.0 if correct else 0.0) - self.tool_cost * len(self.calls)
        self._done, self._ret = True, reward
        return StepResult([reward], True, {
            "correct": bool(correct), "answer": format_number(self.value),
            "calls": len(self.calls), "used_tool": int(bool(self.calls)),
            "correct_without_tool": int(bool(correct) and not self.calls)})

    def state_key(self) -> str:
        calls = ";".join(e for e, _ in self.calls)
        return f"{self.question}|{calls}|{int(self._done)}"

    def returns(self) -> list[float]:
        return [self._ret]


@register_env("calculator", family="tool", source="calculator tool task (ours; cf. ToolRL 2025)")
def make_calculator(**options) -> Calculator:
    return Calculator(**options)
