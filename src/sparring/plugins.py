"""Plugins: a user's module that registers its own environments, estimators, objectives or
shapers with the ordinary decorators, imported before a config is checked.

A plugin is a module name (``my_plugin``, found on ``sys.path`` or in the current
directory) or the path of a ``.py`` file (``path/to/my_plugin.py``). Importing it runs its
``@register_env`` / ``@estimator`` / ``@objective`` / ``@shaper`` decorators, so a config
can name what it registers. Name plugins with ``sparring train --plugin my_plugin`` or with
the config's top-level ``plugins: [my_plugin]``. The run's ``config.yaml`` keeps them, but a
run folder is data: ``--resume``, ``eval``, ``play`` and ``export`` import its plugins only
when named again with ``--plugin`` or with ``--trust-remote-code``
(`sparring.train.restore.read_run_config`).

`import_object("module:attr")` is the same lookup for one object (an adapter's text
functions named in a YAML config). Such references are code too: an env that takes them
declares which modules its options would import (``register_env(imports=...)``), and a run
folder's config may name only Sparring's own modules there unless the caller trusts it
(`sparring.train.restore.read_run_config`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

_BY_FILE: dict[Path, ModuleType] = {}  # plugins loaded from a .py path, by resolved path


class PluginError(ImportError):
    """A plugin that cannot be imported; the message is one line."""


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


def import_plugin(name: str) -> ModuleType:
    """Import one plugin (a module name or a ``.py`` path); importing it twice is a no-op."""
    if not isinstance(name, str) or not name.strip():
        raise PluginError(f"plugin: expected a module name or a .py path, got {name!r}")
    try:
        return _import_file(Path(name)) if _is_path(name) else _import_module(name)
    except PluginError:
        raise
    except Exception as e:
        hint = "" if _is_path(name) else " (put it on PYTHONPATH, in the current directory, " \
            "or give the path of its .py file)"
        raise PluginError(f"plugin {name!r}: cannot import it: {type(e).__name__}: {e}{hint}"
                          ) from e


def import_plugins(names: Iterable[str]) -> list[ModuleType]:
    """Import each plugin in order (see `import_plugin`)."""
    return [import_plugin(n) for n in names]


def import_object(ref: Any, what: str = "object") -> Any:
    """``"package.module:attr"`` (``attr`` may be dotted) -> that object; anything that is
    not a string is returned as it is. ``what`` names the option in errors (a bad
    reference is a ValueError: a bad option value, not a missing package)."""
    if not isinstance(ref, str):
        return ref
    module, sep, attr = ref.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{what}: expected 'module:attribute', got {ref!r}")
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


def reference_module(ref: Any) -> str | None:
    """The module a ``"module:attr"`` reference would import (None for anything else)."""
    if not isinstance(ref, str):
        return None
    module, sep, _ = ref.partition(":")
    return module.strip() if sep else None


def is_sparring_module(module: str) -> bool:
    """Whether ``module`` is part of Sparring itself (code the user already runs)."""
    return module == "sparring" or module.startswith("sparring.")


__all__ = ["PluginError", "import_object", "is_sparring_module", "reference_module", "import_plugin", "import_plugins"]
