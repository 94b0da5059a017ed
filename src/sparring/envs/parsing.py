"""Shared parsers from raw model text to a `ParseResult`. They never raise.

* `parse_choice`: the answer is one of a finite set of legal action strings. Looks first
  inside an answer tag (``<answer>...</answer>``), else takes the *last* legal action
  mentioned in the text as a whole word.
* `parse_tagged`: free-text answers inside an answer tag (or the whole stripped text).
* `strict_answer`: whether a text is exactly an answer format with one move in it (the
  arena's ``strict_format``: a move buried in prose does not count).
"""

from __future__ import annotations

import functools
import re

from sparring.envs.base import ParseResult

MAX_TEXT = 4096  # longer outputs are cut before parsing (bounded work on huge text)
_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def clean(text: object) -> str:
    """Any object -> a bounded str without NULs; bytes are decoded leniently."""
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8", errors="replace")
    elif not isinstance(text, str):
        text = "" if text is None else str(text)
    return text[:MAX_TEXT].replace("\x00", "")


def answer_span(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` tag, stripped; None when absent."""
    found = _TAG.findall(text)
    return found[-1].strip() if found else None


@functools.lru_cache(maxsize=256)
def _mentions(vocab: tuple[str, ...]) -> tuple[re.Pattern[str], dict[str, str]]:
    """One pattern that finds, at every position of a lower-cased text, the longest action
    of ``vocab`` there as a whole word (a zero-width match, so mentions that overlap are all
    found), and each lower-cased action's first spelling in ``vocab``."""
    names: dict[str, str] = {}
    for a in vocab:
        names.setdefault(a.lower(), a)
    alternatives = "|".join(re.escape(a) for a in sorted(names, key=len, reverse=True))
    return re.compile(rf"(?=(?<![\w])({alternatives})(?![\w]))"), names


def parse_choice(text: object, legal: list[str], all_actions: list[str] | None = None) -> ParseResult:
    """Classify ``text`` against ``legal`` actions (case-insensitive, whole words).

    ``all_actions``: every action of the game; mentioning one that is not legal now is
    "illegal" rather than "unparsable".
    """
    t = clean(text)
    span = answer_span(t)
    hay = (span if span is not None else t).strip()
    if not hay:
        return ParseResult("unparsable", error="empty answer")
    vocab = tuple(dict.fromkeys((all_actions or []) + legal))
    best: tuple[int, str] | None = None  # the last mention: its start and action
    if vocab:
        pattern, names = _mentions(vocab)
        for m in pattern.finditer(hay.lower()):
            best = (m.start(), names[m.group(1)])
    if best is None:
        return ParseResult("unparsable", error=f"no move found; legal moves: {', '.join(legal)}")
    if best[1] in legal:
        return ParseResult("legal", action=best[1])
    return ParseResult("illegal", action=None,
                       error=f"{best[1]!r} is not legal now; legal moves: {', '.join(legal)}")


def parse_tagged(text: object, require_tag: bool = False) -> ParseResult:
    """Free-text answer: the answer tag's content, or the whole stripped text."""
    t = clean(text)
    span = answer_span(t)
    if span is None:
        if require_tag:
            return ParseResult("unparsable", error="answer must be inside <answer>...</answer>")
        span = t.strip()
    if not span:
        return ParseResult("unparsable", error="empty answer")
    return ParseResult("legal", action=span)


def strict_answer(text: object, answer_format: str) -> str | None:
    """The move of ``text`` when the whole text is ``answer_format`` with one move in it
    (``"<answer>{}</answer>"``: ``"<answer>bet</answer>"``; whitespace around the text and
    around the move aside, letter case kept), else None: prose around it, a missing or
    repeated tag, a line break, an empty move. Whether the move is one action, and legal,
    is the env's to say (`Arena` checks that it reads the move as written)."""
    before, after = answer_format.split("{}")
    t = clean(text).strip()
    if not (t.startswith(before) and t.endswith(after) and len(t) >= len(before) + len(after)):
        return None
    move = t[len(before):len(t) - len(after)].strip()
    if not move or any(c in move for c in "\n<>"):
        return None
    return move
