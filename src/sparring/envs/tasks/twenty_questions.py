"""Twenty questions with a rule-based oracle over an attribute table (no language model).

The oracle thinks of one object (drawn from the seed). Each turn the agent asks either
``is it <attribute>?`` (answered yes/no from the table) or guesses ``is it a <object>?``.
A right guess ends the episode with reward 1; every question and wrong guess uses one of
``max_questions``; when they run out the episode ends with 0. The setting is the
twenty-questions benchmark of ArCHer (Zhou et al. 2024), with a table instead of an LLM
oracle; all objects differ in some attribute, so ``ceil(log2(#objects))`` well-chosen
questions plus one guess always win.

Parsing: the last ``is it [a|an|the] <attribute or object>`` in the text, case-insensitive.
``state_key()`` is the hidden object plus the set of questions asked so far.
"""

from __future__ import annotations

import random
import re

from sparring.envs import register_env
from sparring.envs.base import ParseResult, StepResult
from sparring.envs.parsing import answer_span, clean, parse_choice

ATTRIBUTES = ("alive", "an animal", "a mammal", "able to fly", "found in water",
              "bigger than a person", "edible", "made of metal", "electronic",
              "found in a kitchen", "green", "a vehicle")

OBJECTS: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in {
    "dog": {"alive", "an animal", "a mammal"},
    "horse": {"alive", "an animal", "a mammal", "bigger than a person"},
    "whale": {"alive", "an animal", "a mammal", "found in water", "bigger than a person"},
    "bat": {"alive", "an animal", "a mammal", "able to fly"},
    "eagle": {"alive", "an animal", "able to fly"},
    "duck": {"alive", "an animal", "able to fly", "found in water", "edible"},
    "shark": {"alive", "an animal", "found in water", "bigger than a person"},
    "goldfish": {"alive", "an animal", "found in water"},
    "frog": {"alive", "an animal", "found in water", "green"},
    "tree": {"alive", "bigger than a person", "green"},
    "cactus": {"alive", "green"},
    "lettuce": {"edible", "found in a kitchen", "green"},
    "bread": {"edible", "found in a kitchen"},
    "car": {"bigger than a person", "made of metal", "a vehicle"},
    "bicycle": {"made of metal", "a vehicle"},
    "airplane": {"able to fly", "bigger than a person", "made of metal", "a vehicle"},
    "ship": {"found in water", "bigger than a person", "made of metal", "a vehicle"},
    "spoon": {"made of metal", "found in a kitchen"},
    "fridge": {"bigger than a person", "made of metal", "electronic", "found in a kitchen"},
    "phone": {"electronic"},
    "book": set(),
    "coin": {"made of metal"},
}.items()}

_ARTICLE = re.compile(r"\bis\s+it\s+(?:a|an|the)\s+")


def _key(phrase: str) -> str:
    """``"an animal"`` -> ``"is it animal"``: the article-free form the parser matches."""
    words = phrase.split()
    if words[0] in ("a", "an", "the"):
        words = words[1:]
    return "is it " + " ".join(words)


def question(attribute: str) -> str:
    return f"is it {attribute}?"


def guess(obj: str) -> str:
    return f"is it {'an' if obj[0] in 'aeiou' else 'a'} {obj}?"


class TwentyQuestions:
    """See the module docstring."""

    name = "twenty_questions"
    num_seats = 1
    outcome_keys = ("correct",)

    def __init__(self, max_questions: int = 20, objects: list[str] | None = None):
        if max_questions < 1:
            raise ValueError(f"twenty_questions: max_questions={max_questions}; must be >= 1")
        unknown = sorted(set(objects or ()) - set(OBJECTS))
        if unknown or objects is not None and not objects:
            raise ValueError(f"twenty_questions: unknown or no objects {unknown}; "
                             f"known: {', '.join(OBJECTS)}")
        self.objects = list(objects) if objects else list(OBJECTS)
        self.max_questions = max_questions
        self._meaning = {question(a): ("attr", a) for a in ATTRIBUTES}
        self._meaning.update({guess(o): ("guess", o) for o in self.objects})
        self.actions = list(self._meaning)
        self._by_key = {_key(a.rstrip("?")[len("is it "):]): a for a in self.actions}
        self.reset(0)

    def reset(self, seed: int) -> None:
        self.secret = random.Random(seed).choice(self.objects)
        self.history: list[tuple[str, str]] = []  # (what was asked, "yes"/"no")
        self._done, self._ret = False, 0.0

    def current_seat(self) -> int | None:
        return None if self._done else 0

    def system_prompt(self, seat: int) -> str:
        return ("Find the object I think of. Ask 'is it <property>?' (properties: "
                f"{', '.join(ATTRIBUTES)}) or guess 'is it a <object>?'. "
                f"Objects: {', '.join(self.objects)}. One question per turn.")

    def observation(self, seat: int) -> str:
        lines = [f"{q.removeprefix('is it ')} {a}" for q, a in self.history]
        lines.append(f"questions left: {self.max_questions - len(self.history)}")
        return "\n".join(lines)

    def legal_actions(self, seat: int) -> list[str] | None:
        return list(self.actions)

    def parse(self, seat: int, text: str) -> ParseResult:
        t = clean(text)
        span = answer_span(t)
        hay = " ".join((span if span is not None else t).lower().split())
        hay = _ARTICLE.sub("is it ", hay)
        p = parse_choice(hay, list(self._by_key))
        if not p.ok:
            return ParseResult("unparsable", error="ask 'is it <property>?' or guess "
                               "'is it a <object>?' with a listed property or object")
        return ParseResult("legal", action=self._by_key[p.action])

    def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError("twenty_questions: step() after the episode ended; call reset(seed)")
        if action not in self._meaning:
            raise ValueError(f"twenty_questions: unknown action {action!r:.60}")
        kind, what = self._meaning[action]
        correct = kind == "guess" and what == self.secret
        yes = correct if kind == "guess" else what in OBJECTS[self.secret]
        self.history.append((action, "yes" if yes else "no"))
        reward = 1.0 if correct else 0.0
        self._done = correct or len(self.history) >= self.max_questions
        self._ret += reward
        return StepResult([reward], self._done, {"answer": "yes" if yes else "no",
                                                 "correct": correct,
                                                 "secret": self.secret if self._done else None})

    def state_key(self) -> str:
        asked = ";".join(sorted(q for q, _ in self.history))
        return f"{self.secret}|{asked}|{len(self.history)}"

    def returns(self) -> list[float]:
        return [self._ret]


@register_env("twenty_questions", family="task", source="ArCHer (Zhou et al. 2024), table oracle")
def make_twenty_questions(**options) -> TwentyQuestions:
    return TwentyQuestions(**options)
