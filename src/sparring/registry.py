"""Name -> function registries for estimators, objectives and aggregations.

A `Registry` maps a name to an `Entry` (the function plus metadata: family, needs,
layout, source). Registering a name twice is an error; asking for an unknown name is
an error listing the known ones.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


class UnknownNameError(KeyError):
    """Raised for a name no registry entry has; the message lists the known names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def option_names(fn: Callable[..., Any]) -> set[str] | None:
    """Keyword-only option names of ``fn``; None when it takes ``**kwargs`` (anything goes)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind is p.KEYWORD_ONLY}


@dataclass(frozen=True)
class Entry:
    name: str
    fn: Callable[..., Any]
    family: str = ""
    needs: tuple[str, ...] = ()
    layout: str = "any"
    source: str = ""
    summary: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def check_options(self, options: dict[str, Any], kind: str = "",
                      internal: tuple[str, ...] = ()) -> None:
        """Raise ValueError naming any option ``fn`` does not take, with the allowed ones.
        ``internal``: keywords the framework passes itself (not user options)."""
        allowed = option_names(self.fn)
        if allowed is None:
            return
        allowed -= set(internal)
        for key in options:
            if key not in allowed:
                close = difflib.get_close_matches(key, sorted(allowed), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"{kind} {self.name!r} has no option {key!r}{hint}; "
                                 f"allowed: {', '.join(sorted(allowed)) or '(none)'}")


class Registry:
    """A named collection of functions of one kind (e.g. "estimator")."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def add(self, entry: Entry) -> Entry:
        if entry.name in self._entries:
            raise ValueError(f"{self.kind} {entry.name!r} is already registered")
        self._entries[entry.name] = entry
        return entry

    def register(self, name: str, **meta: Any) -> Callable[[Callable], Callable]:
        """Decorator: `@REG.register("grpo", family=..., needs=(...), source=...)`."""

        def deco(fn: Callable) -> Callable:
            doc = (fn.__doc__ or "").strip().splitlines()
            summary = meta.pop("summary", doc[0] if doc else "")
            known = {"family", "needs", "layout", "source"}
            extra = {k: meta.pop(k) for k in list(meta) if k not in known}
            self.add(Entry(name=name, fn=fn, summary=summary, extra=extra, **meta))
            return fn

        return deco

    def get(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def __getitem__(self, name: str) -> Callable[..., Any]:
        return self.get(name).fn

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(sorted(self._entries.values(), key=lambda e: (e.family, e.name)))

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return sorted(self._entries)
