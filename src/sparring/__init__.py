"""Sparring: reinforcement learning for LLM agents in multi-turn, multi-agent settings."""

from typing import Any

from sparring.data import Episode, Turn, TurnBatch, collate, load_jsonl, save_jsonl

__version__ = "0.1.0"
_API = ("Config", "StopTraining", "Trainer")  # from sparring.api, imported when first asked for


def __getattr__(name: str) -> Any:
    if name in _API:  # lazily: `import sparring.envs` need not load the trainer
        from sparring import api

        return getattr(api, name)
    raise AttributeError(f"module 'sparring' has no attribute {name!r}")


__all__ = ["Config", "Episode", "StopTraining", "Trainer", "Turn", "TurnBatch", "collate",
           "load_jsonl", "save_jsonl", "__version__"]
