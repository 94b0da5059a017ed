"""Sparring: reinforcement learning for LLM agents in multi-turn, multi-agent settings."""

from typing import Any

from sparring.data import Episode, Turn, TurnBatch, collate, load_jsonl, save_jsonl


def _version() -> str:
    """The installed package's version (its metadata, written from pyproject.toml when it is
    installed); in a source tree on ``sys.path`` that was never installed, pyproject.toml's
    own. pyproject.toml is the one place the version is written."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sparring")
    except PackageNotFoundError:
        import tomllib
        from pathlib import Path

        try:
            with open(Path(__file__).parents[2] / "pyproject.toml", "rb") as f:
                return str(tomllib.load(f)["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"


__version__ = _version()
_API = ("Config", "StopTraining", "Trainer")  # from sparring.api, imported when first asked for


def __getattr__(name: str) -> Any:
    if name in _API:  # lazily: `import sparring.envs` need not load the trainer
        from sparring import api

        return getattr(api, name)
    raise AttributeError(f"module 'sparring' has no attribute {name!r}")


__all__ = ["Config", "Episode", "StopTraining", "Trainer", "Turn", "TurnBatch", "collate",
           "load_jsonl", "save_jsonl", "__version__"]
