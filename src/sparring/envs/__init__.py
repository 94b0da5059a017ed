"""Environments: the registry (`make`, `list_envs`) and the protocol (`sparring.envs.base`).

Environment modules register a factory with `register_env`; importing this package
imports them (``_ENV_MODULES``), so ``make("tictactoe")`` just works. A game may also be
registered under aliases (OpenSpiel's names: ``make("leduc_poker")`` is ``leduc``), and
may declare ``game_tree=True``: its instances expose the exact game tree (see
`sparring.envs.base.TreeGame`), so exploitability and the CFR bot apply to it
(`has_game_tree`). An env whose options can name code (an adapter's ``"module:attr"``
functions) declares ``references=fn``, ``fn(options) -> {option: "module:attr"}``, so a run
folder's config is checked against `sparring.plugins.check_reference` before anything is
imported or built (`code_references`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from sparring.envs.base import Env, ParseResult, StepResult
from sparring.plugins import add_exposer
from sparring.registry import Entry, Registry

ENVS = Registry("environment")

# Modules that register environments when imported. Add new ones here.
_ENV_MODULES: tuple[str, ...] = (
    "sparring.envs.games.tictactoe",
    "sparring.envs.games.connect_four",
    "sparring.envs.games.nim",
    "sparring.envs.games.kuhn_poker",
    "sparring.envs.games.leduc",
    "sparring.envs.games.negotiation",
    "sparring.envs.games.signalling",
    "sparring.envs.tasks.arithmetic",
    "sparring.envs.tasks.frozen_lake",
    "sparring.envs.tasks.sokoban",
    "sparring.envs.tasks.twenty_questions",
    "sparring.envs.tasks.calculator",
    "sparring.envs.adapters.open_spiel",  # imports pyspiel only when an env is built
    "sparring.envs.adapters.textarena",  # imports textarena only when an env is built
    "sparring.envs.adapters.pettingzoo",  # imports pettingzoo only when an env is built
    "sparring.envs.adapters.gymnasium",  # imports gymnasium only when an env is built
)


def register_env(
    name: str, *, family: str, source: str = "", needs: tuple[str, ...] = (),
    aliases: tuple[str, ...] = (), game_tree: bool = False,
    references: Callable[[dict[str, Any]], dict[str, str]] | None = None,
) -> Callable[[Callable[..., Env]], Callable[..., Env]]:
    """Register a factory ``fn(**options) -> Env``. ``family``: game, cooperative, task, tool;
    ``aliases``: other names of the same game (e.g. OpenSpiel's); ``game_tree``: its envs
    implement `sparring.envs.base.TreeGame` (exact exploitability, CFR); ``references``:
    the ``"module:attr"`` code references given options hold (each resolved with
    `sparring.plugins.import_object`), by option name."""
    return ENVS.register(name, family=family, source=source, needs=needs, aliases=aliases,
                         game_tree=game_tree, references=references)


def _load() -> None:
    for mod in _ENV_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:  # an environment (or its package) not written yet
            if e.name is None or not (mod == e.name or mod.startswith(e.name + ".")):
                raise


add_exposer(_load)  # untrusted references resolve once the adapters have exposed theirs


def make(name: str, **options: Any) -> Env:
    """Build environment ``name`` with its options; unknown names list the known ones."""
    return env_entry(name).fn(**options)


def env_entry(name: str) -> Entry:
    """The registry entry of env ``name`` (a canonical name or an alias)."""
    _load()
    return ENVS.get(name)


def has_game_tree(name: str) -> bool:
    """Whether env ``name`` declared an exact game tree (exploitability and CFR apply)."""
    return bool(env_entry(name).extra.get("game_tree"))


def code_references(name: str, options: dict[str, Any]) -> dict[str, str]:
    """``{option: "module:attr"}``: the code references building env ``name`` with
    ``options`` would resolve (empty for an env whose options name no code)."""
    references = env_entry(name).extra.get("references")
    return dict(references(options)) if references is not None else {}


def list_envs() -> list[Entry]:
    _load()
    return list(ENVS)


__all__ = ["ENVS", "Env", "ParseResult", "StepResult", "env_entry", "has_game_tree",
           "code_references", "list_envs", "make", "register_env"]
