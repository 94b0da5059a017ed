"""Name -> function registries for estimators, objectives, aggregations, environments, bots.

A `Registry` maps a name to an `Entry` (the function plus metadata: family, needs,
layout, source, aliases). An alias (e.g. OpenSpiel's ``leduc_poker`` for ``leduc``)
resolves to its canonical entry everywhere a name is looked up; ``entry.name`` is the
canonical name. Registering a name or alias twice is an error; asking for an unknown
name is an error listing the known ones.
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
    aliases: tuple[str, ...] = ()

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
                close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"{kind} {self.name!r} has no option {key!r}{hint}; "
                                 f"allowed: {', '.join(sorted(allowed)) or '(none)'}")
        wrong = option_type_error(self.fn, options)
        if wrong:
            raise ValueError(f"{kind} {self.name!r} {wrong}")


_SCALARS = (bool, int, float, str)


def option_types(fn: Callable[..., Any]) -> dict[str, type]:
    """The options of ``fn`` annotated with one plain scalar type (bool, int, float, str,
    or that type or None), by name; options with other annotations are not listed."""
    import typing

    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation that does not resolve: nothing to check
        return {}
    out: dict[str, type] = {}
    for name, hint in hints.items():
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        plain = hint if hint in _SCALARS else args[0] if len(args) == 1 else None
        if plain in _SCALARS:
            out[name] = plain
    return out


def option_type_error(fn: Callable[..., Any], options: dict[str, Any]) -> str | None:
    """"option 'k' takes a bool, got 'false'" for the first option whose value does not fit
    its scalar annotation in ``fn`` (`option_types`); None when all fit."""
    hints = option_types(fn)
    for key, value in options.items():
        want = hints.get(key)
        if want is not None and value is not None and not _is_a(value, want):
            return f"option {key!r} takes a {want.__name__}, got {value!r}"
    return None


def _is_a(value: Any, want: type) -> bool:
    """``value`` fits an option of type ``want``: a bool is not an int or a float (YAML's
    ``"false"`` is a string, not a bool), an int is a float."""
    if want is bool or isinstance(value, bool):
        return want is bool and isinstance(value, bool)
    if want is float:
        return isinstance(value, (int, float))
    return isinstance(value, want)


class Registry:
    """A named collection of functions of one kind (e.g. "estimator")."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry] = {}
        self._aliases: dict[str, str] = {}  # alias -> canonical name

    def add(self, entry: Entry) -> Entry:
        for name in (entry.name, *entry.aliases):
            if name in self._entries or name in self._aliases:
                raise ValueError(f"{self.kind} {name!r} is already registered")
        if len(set(entry.aliases)) != len(entry.aliases) or entry.name in entry.aliases:
            raise ValueError(f"{self.kind} {entry.name!r}: repeated aliases {entry.aliases}")
        self._entries[entry.name] = entry
        self._aliases.update(dict.fromkeys(entry.aliases, entry.name))
        return entry

    def register(self, name: str, **meta: Any) -> Callable[[Callable], Callable]:
        """Decorator: `@REG.register("grpo", family=..., needs=(...), source=...)`."""

        def deco(fn: Callable) -> Callable:
            doc = (fn.__doc__ or "").strip().splitlines()
            summary = meta.pop("summary", doc[0] if doc else "")
            known = {"family", "needs", "layout", "source", "aliases"}
            extra = {k: meta.pop(k) for k in list(meta) if k not in known}
            meta["aliases"] = tuple(meta.get("aliases", ()))
            self.add(Entry(name=name, fn=fn, summary=summary, extra=extra, **meta))
            return fn

        return deco

    def get(self, name: str) -> Entry:
        """The entry of ``name`` or of the canonical name ``name`` is an alias of."""
        try:
            return self._entries[self._aliases.get(name, name)]
        except (KeyError, TypeError):
            known = ", ".join(sorted(self._entries)) or "(none)"
            aliases = ", ".join(f"{a} = {c}" for a, c in sorted(self._aliases.items()))
            known += f" (aliases: {aliases})" if aliases else ""
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def canonical(self, name: str) -> str:
        """The registered name ``name`` stands for (itself, or the entry it is an alias of)."""
        return self.get(name).name

    def __getitem__(self, name: str) -> Callable[..., Any]:
        return self.get(name).fn

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._aliases

    def __iter__(self) -> Iterator[Entry]:
        return iter(sorted(self._entries.values(), key=lambda e: (e.family, e.name)))

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        """The canonical names, sorted (aliases are in each entry's ``aliases``)."""
        return sorted(self._entries)


# ------------------------------------------------------------------ components with options
# A component is a registered frozen dataclass (``kw_only``) whose fields are its options:
# ``{name: random_opening, moves: 4}`` in a config builds ``STARTS.get("random_opening").fn
# (moves=4)``. `option` gives a field its help and numeric bounds; `build_component` checks
# the names, types and bounds and builds it; `describe_options` lists the options for help.

_BOUND_OPS = {"ge": (">=", lambda v, b: v >= b), "gt": (">", lambda v, b: v > b),
              "le": ("<=", lambda v, b: v <= b), "lt": ("<", lambda v, b: v < b)}


def option(default: Any, help: str, **bounds: float) -> Any:
    """A component option: a dataclass field with its ``help`` and bounds (``ge``, ``gt``,
    ``le``, ``lt``), checked by `build_component`."""
    return field(default=default, metadata={"help": help, **bounds})


def bound_error(value: Any, meta: Any) -> str | None:
    """"must be >= 0" for a number outside the bounds in ``meta``; None when inside (or not a
    number)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    for op, (sym, ok) in _BOUND_OPS.items():
        if op in meta and not ok(value, meta[op]):
            return f"must be {sym} {meta[op]}"
    return None


def build_component(registry: Registry, spec: Any) -> Any:
    """The component a config entry ``{name: ..., option: value, ...}`` names, built from its
    options; ValueError (UnknownNameError for a name) saying what is wrong."""
    import dataclasses

    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"expected {{name: ..., option: value, ...}}, got {spec!r}")
    entry = registry.get(spec["name"])
    options = {k: v for k, v in spec.items() if k != "name"}
    entry.check_options(options, registry.kind)
    if isinstance(entry.fn, type) and dataclasses.is_dataclass(entry.fn):
        for f in dataclasses.fields(entry.fn):
            if f.name in options:
                why = bound_error(options[f.name], f.metadata)
                if why:
                    raise ValueError(f"{registry.kind} {entry.name!r} option {f.name!r}: "
                                     f"{options[f.name]!r} is out of range ({why})")
    try:
        return entry.fn(**options)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{registry.kind} {entry.name!r}: {e}") from None


def describe_options(fn: Callable[..., Any]) -> list[tuple[str, Any, str]]:
    """``(option, default, help)`` of each option of a component class (`option` fields)."""
    import dataclasses

    if not (isinstance(fn, type) and dataclasses.is_dataclass(fn)):
        return []
    return [(f.name, f.default, f.metadata.get("help", "")) for f in dataclasses.fields(fn)
            if f.init]
