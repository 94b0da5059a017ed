"""Plugins and code references: everything a config may name by import path.

A plugin is a module name (``my_plugin``, found on ``sys.path`` or in the current
directory) or the path of a ``.py`` file (``path/to/my_plugin.py``). Importing it runs its
``@register_env`` / ``@estimator`` / ``@objective`` / ``@shaper`` decorators, so a config
can name what it registers. Name plugins with ``sparring train --plugin my_plugin`` or with
the config's top-level ``plugins: [my_plugin]``.

A code reference is ``"module:attr"`` in a config (a PettingZoo or Gymnasium adapter's
``env``, ``obs_to_text``, ``action_to_text``, ``text_to_action``). `import_object` is the
one resolver of such references, `import_plugin` the one importer of plugins, and both
follow one rule:

* A trusted config (one you wrote: ``sparring train my.yaml``, the Python API, or a run
  folder opened with ``--trust-remote-code``) may name any module and any attribute
  (``attr`` may be dotted).
* An untrusted one (a run folder's ``config.yaml`` read by ``eval``, ``play``, ``export``
  or ``train --resume`` without ``--trust-remote-code``; `untrusted` marks the scope) may
  name only the references Sparring exposes (`expose`: the adapters' text helpers, such as
  ``sparring.envs.adapters.pettingzoo:tictactoe_text``) and imports no plugin. Such a
  reference is looked up in a table, never imported or walked, so no module, attribute
  path or callable chosen by the file is reached. Being defined in a ``sparring`` module
  is not enough: Sparring has public functions that import a module or write a file
  named by their arguments (`import_plugin`, `sparring.storage.atomic.atomic_write_text`),
  and an adapter's ``env`` is called with the file's ``env_kwargs``.

`check_reference` applies the rule to a string without resolving it; a run folder's config
is checked with it before anything is built (`sparring.config.run_folder.read_run_config`,
using the references each env declares with ``register_env(references=...)``).
"""

from __future__ import annotations

import contextvars
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

_BY_FILE: dict[Path, ModuleType] = {}  # plugins loaded from a .py path, by resolved path
_EXPOSED: dict[str, Any] = {}  # "module:attr" -> the object an untrusted config may name
_EXPOSERS: list[Callable[[], None]] = []  # loaders of the modules that expose (`add_exposer`)
_TRUSTED: contextvars.ContextVar[bool] = contextvars.ContextVar("sparring_trusted",
                                                               default=True)
TRUST_HINT = "pass --trust-remote-code if you trust this folder"


class PluginError(ImportError):
    """A plugin that cannot be imported; the message is one line."""


class UntrustedCodeError(ValueError):
    """An untrusted config names code Sparring does not expose; the message is one line."""


# ---------------------------------------------------------------- trust


def is_trusted() -> bool:
    """Whether the config being read or built now may name any code (see the module doc)."""
    return _TRUSTED.get()


@contextmanager
def untrusted() -> Iterator[None]:
    """Within the block, `import_object` resolves only exposed references and
    `import_plugin` imports nothing (a run folder's config read without trust)."""
    token = _TRUSTED.set(False)
    try:
        yield
    finally:
        _TRUSTED.reset(token)


def _trusted(trusted: bool | None) -> bool:
    return is_trusted() if trusted is None else trusted


# ---------------------------------------------------------------- exposed references


def expose(obj: Any = None, *, name: str | None = None, module: str | None = None) -> Any:
    """Let an untrusted config name ``obj`` as ``"module:name"``: ``@expose`` on a function
    or class (its own ``__module__`` and ``__name__``), or ``expose(VALUE, name="NAMES",
    module=__name__)`` for a constant such as a list of action names. Only Sparring's own
    modules expose, and only public names."""
    def add(o: Any) -> Any:
        mod = module or getattr(o, "__module__", None)
        attr = name or getattr(o, "__name__", None)
        if not (isinstance(mod, str) and _is_sparring_module(mod) and isinstance(attr, str)
                and _public(attr) and all(_public(p) for p in mod.split("."))):
            raise ValueError(f"expose: {mod}:{attr} is not a public name of a sparring module")
        key = f"{mod}:{attr}"
        if key in _EXPOSED and _EXPOSED[key] is not o:
            raise ValueError(f"expose: {key} is already exposed")
        _EXPOSED[key] = o
        return o

    return add if obj is None else add(obj)


def exposed_references() -> list[str]:
    """Every reference an untrusted config may name, sorted."""
    _load_exposed()
    return sorted(_EXPOSED)


def add_exposer(load: Callable[[], None]) -> None:
    """Register ``load``, which imports a fixed list of Sparring's modules (none chosen by a
    config) that `expose` names: the env registry registers the loader of its env modules,
    whose adapters expose their helpers. Every exposer runs before a lookup."""
    if load not in _EXPOSERS:
        _EXPOSERS.append(load)


def _load_exposed() -> None:
    for load in _EXPOSERS:
        load()


# ---------------------------------------------------------------- references


def split_reference(ref: str, what: str = "object") -> tuple[str, str]:
    """``"module:attr"`` -> (module, attr); a ValueError naming ``what`` otherwise."""
    module, sep, attr = ref.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{what}: expected 'module:attribute', got {ref!r}")
    return module, attr


def check_reference(ref: Any, what: str = "object", *, trusted: bool | None = None) -> None:
    """Whether ``ref`` (a ``"module:attr"`` string; anything else passes) may be resolved
    under the trust rule (module doc): an `UntrustedCodeError` naming ``what`` if not, a
    ValueError for a malformed one. Imports nothing but Sparring's own env modules."""
    if not isinstance(ref, str):
        return
    module, _ = split_reference(ref, what)
    if _trusted(trusted):
        return
    _load_exposed()
    if ref not in _EXPOSED:
        raise UntrustedCodeError(
            f"{what} names {ref!r}, code in the module {module!r}; a run folder's config may "
            f"name only the references Sparring exposes (such as {_example()}): {TRUST_HINT}")


def _example() -> str:
    return next(iter(sorted(_EXPOSED)), "none")


def import_object(ref: Any, what: str = "object", *, trusted: bool | None = None) -> Any:
    """``"package.module:attr"`` -> that object; anything that is not a string is returned
    as it is. The one resolver of a config's code references: untrusted (``trusted``
    False, or inside `untrusted`), only an exposed reference resolves, to the exposed
    object, without an import; trusted, ``attr`` may be dotted. ``what`` names the option
    in errors (a bad reference is a ValueError: a bad option value, not a missing package)."""
    if not isinstance(ref, str):
        return ref
    module, attr = split_reference(ref, what)
    if ref in _EXPOSED:
        return _EXPOSED[ref]
    check_reference(ref, what, trusted=trusted)  # raises unless trusted (or now exposed)
    if ref in _EXPOSED:
        return _EXPOSED[ref]
    try:
        obj: Any = _import_module(module)
    except Exception as e:
        raise ValueError(f"{what}: cannot import module {module!r} of {ref!r}: {e}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{what}: module {module!r} has no attribute {attr!r}") from None
    return obj


def import_module_named(module: str, what: str = "module", *,
                        trusted: bool | None = None) -> ModuleType:
    """Import ``module`` because a config named it (Gymnasium's ``"module:Env-v0"`` ids);
    untrusted, no module may be named (an `UntrustedCodeError` naming ``what``)."""
    if not _trusted(trusted):
        raise UntrustedCodeError(f"{what} imports the module {module!r}; a run folder's "
                                 f"config imports no module: {TRUST_HINT}")
    try:
        return _import_module(module)
    except Exception as e:
        raise ValueError(f"{what}: cannot import module {module!r}: {e}") from e


def _is_sparring_module(module: str) -> bool:
    return module == "sparring" or module.startswith("sparring.")


def _public(name: str) -> bool:
    return name.isidentifier() and not name.startswith("_")


# ---------------------------------------------------------------- plugins


def _is_path(name: str) -> bool:
    return name.endswith(".py") or os.sep in name or "/" in name


def _import_module(name: str) -> ModuleType:
    """``name`` as a module, with the current directory searched last."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.append(cwd)
    try:
        return importlib.import_module(name)
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _import_file(path: Path) -> ModuleType:
    path = path.resolve()
    if path in _BY_FILE:  # a second import would register everything twice
        return _BY_FILE[path]
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"not a Python module: {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(path.stem, module)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if sys.modules.get(path.stem) is module:
            del sys.modules[path.stem]
        raise
    _BY_FILE[path] = module
    return module


def import_plugin(name: str, *, trusted: bool | None = None) -> ModuleType:
    """Import one plugin (a module name or a ``.py`` path); importing it twice is a no-op.
    Untrusted (inside `untrusted`), no plugin is imported: a `PluginError`."""
    if not isinstance(name, str) or not name.strip():
        raise PluginError(f"plugin: expected a module name or a .py path, got {name!r}")
    if not _trusted(trusted):
        raise PluginError(f"plugin {name!r}: a run folder's config imports no plugin: name "
                          "it with --plugin, or pass --trust-remote-code")
    try:
        return _import_file(Path(name)) if _is_path(name) else _import_module(name)
    except PluginError:
        raise
    except Exception as e:
        hint = "" if _is_path(name) else " (put it on PYTHONPATH, in the current directory, " \
            "or give the path of its .py file)"
        raise PluginError(f"plugin {name!r}: cannot import it: {type(e).__name__}: {e}{hint}"
                          ) from e


def import_plugins(names: Iterable[str], *, trusted: bool | None = None) -> list[ModuleType]:
    """Import each plugin in order (see `import_plugin`)."""
    return [import_plugin(n, trusted=trusted) for n in names]


def reference(value: Any) -> str | None:
    """``value`` when it is a ``"module:attr"`` string (None for anything else): what an
    env's ``references`` declaration lists for an option that may name code."""
    return value if isinstance(value, str) and ":" in value else None


__all__ = ["PluginError", "UntrustedCodeError", "add_exposer", "check_reference", "expose",
           "exposed_references", "import_module_named", "import_object", "import_plugin",
           "import_plugins", "is_trusted", "reference", "split_reference", "untrusted"]
