"""Sparring: reinforcement learning for LLM agents in multi-turn, multi-agent settings."""

from sparring.data import Episode, Turn, TurnBatch, collate, load_jsonl, save_jsonl

__version__ = "0.1.0"
__all__ = ["Episode", "Turn", "TurnBatch", "collate", "load_jsonl", "save_jsonl", "__version__"]
