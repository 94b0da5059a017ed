"""Rollouts sampled by a separate inference engine that is kept in step with the learner.

`EngineRollouts(rollouts, engine, model)` wraps a run's `Rollouts`: the learner's seats
sample from ``engine`` (e.g. a `sparring.policy.vllm.VLLMPolicy`) instead of the HF policy
that shares the learner's model, and at the start of every step ``engine.sync_weights(model)``
hands the engine the learner's current weights.

Syncing when a rollout starts, rather than right after ``learner.update``, covers every way
the weights change between two rollouts: an update, a resume (the checkpoint is loaded into
``model`` before the first rollout), a user's callback; it costs one in-place weight copy a
step, and the training loop needs no hook. Everything else (the opponent pool and its
snapshots, the state a checkpoint saves, the arena the evaluation uses) stays with the
wrapped `Rollouts`, which this object passes attribute reads to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sparring.data import Episode


class EngineRollouts:
    """``rollouts(step)`` with the learner's seats on ``engine``, synced from ``model``.

    ``adapters``: several policies as LoRA adapters of one base model ``model``
    (``lora.shared_base``): each policy's seats sample from its own adapter in the one
    engine (``engine.for_adapter(name)``), and a sync loads every adapter
    (``engine.sync_adapters``)."""

    def __init__(self, rollouts: Any, engine: Any, model: Any, adapters: Sequence[str] = ()):
        self.rollouts, self.engine, self.model = rollouts, engine, model
        self.adapters = list(adapters)
        rollouts.learner.policy = engine
        for name in self.adapters:
            rollouts.players[name].policy = engine.for_adapter(name)

    def sync(self) -> None:
        if self.adapters:
            self.engine.sync_adapters(self.model, self.adapters)
        else:
            self.engine.sync_weights(self.model)

    def __call__(self, step: int) -> list[Episode]:
        self.sync()
        return self.rollouts(step)

    def play(self, step: int, tasks: Sequence[Any]) -> list[Episode]:
        """`Rollouts.play` of some of the step's groups, after a sync."""
        self.sync()
        return self.rollouts.play(step, tasks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rollouts, name)
