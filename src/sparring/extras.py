"""Optional extras, imported when first needed: ``import_extra(module, extra, needed_by)``.

Sparring's optional dependencies (Ray, the environment adapters' packages, tensorboard,
wandb, peft) are imported only by the code that uses them; a missing one is an
``ImportError`` that names what needed it, the extra that installs it and the import's own
error: "the PettingZoo adapter needs the 'pettingzoo' extra: pip install
'sparring[pettingzoo]' (No module named 'pettingzoo')".
"""

from __future__ import annotations

import importlib
from types import ModuleType


def install_hint(extra: str) -> str:
    """The command that installs Sparring's extra ``extra``."""
    return f"pip install 'sparring[{extra}]'"


def import_extra(module: str, extra: str, needed_by: str) -> ModuleType:
    """``module``, imported; an ImportError naming ``needed_by``, ``extra`` and the cause
    when it is missing (or fails to import)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{needed_by} needs the '{extra}' extra: {install_hint(extra)} "
                          f"({e})") from e


__all__ = ["import_extra", "install_hint"]
