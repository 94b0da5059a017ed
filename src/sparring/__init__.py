"""Sparring: reinforcement learning for LLM agents in multi-turn, multi-agent settings."""

import os

# Back PyTorch's large CPU tensors with transparent huge pages: a fresh 256 MB tensor
# then costs ~128 page faults instead of ~65,000 (about 4x faster to fill on our CI
# machine; docs/benchmarks.md). torch reads the variable once, at its first large
# allocation, so this only takes effect when sparring is imported before torch
# allocates; set THP_MEM_ALLOC_ENABLE=0 to opt out.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from sparring.data import Episode, Turn, TurnBatch, collate, load_jsonl, save_jsonl

__version__ = "0.1.0"
__all__ = ["Episode", "Turn", "TurnBatch", "collate", "load_jsonl", "save_jsonl", "__version__"]
