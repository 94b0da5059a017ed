"""Rollouts sampled by separate inference engines that are kept in step with the learners.

`EngineRollouts(rollouts, engines, models)` wraps a run's `Rollouts`: each policy's seats
sample from its engine (e.g. a `sparring.policy.vllm.VLLMPolicy`) instead of the HF policy
that shares its learner's model, and at the start of every step each engine is handed its
policy's current weights (``engine.sync_weights(model)``). Three layouts:
- one policy (the name ''): one engine;
- several policies, each its own model: an engine per policy (each holds a copy of its
  model's weights and its own KV cache, so memory grows with the number of policies);
- several policies as LoRA adapters of one base (``adapters=True``): one engine serves the
  base and every adapter (``engine.for_adapter(name)``), and a sync loads every adapter
  (``engine.sync_adapters``).

Syncing when a rollout starts, rather than right after ``learner.update``, covers every way
the weights change between two rollouts: an update, a resume (the checkpoint is loaded into
the models before the first rollout), a user's callback; it costs one in-place weight copy a
step, and the training loop needs no hook. Everything else (the opponent pool and its
snapshots, the state a checkpoint saves, the arena the evaluation uses) stays with the
wrapped `Rollouts`, which this object passes attribute reads to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sparring.data import Episode


class EngineRollouts:
    """``rollouts(step)`` with each policy's seats on its engine, synced from its model.

    ``engines`` and ``models``: per policy name ('' for a run's one policy), the engine
    that samples its seats and the model it is synced from. ``adapters``: the policies are
    LoRA adapters of one base (``lora.shared_base``): every name maps to the same engine and
    the same PEFT model, and each policy samples with its own adapter."""

    def __init__(self, rollouts: Any, engines: Mapping[str, Any], models: Mapping[str, Any],
                 adapters: bool = False):
        if set(engines) != set(models):
            raise ValueError(f"EngineRollouts: engines for {sorted(engines)}, models for "
                             f"{sorted(models)}")
        self.rollouts, self.adapters = rollouts, adapters
        self.engines, self.models = dict(engines), dict(models)
        for name, engine in self.engines.items():
            if name == "":
                rollouts.learner.policy = engine
            else:
                rollouts.players[name].policy = engine.for_adapter(name) if adapters else engine

    def sync(self) -> None:
        """Every engine gets its policy's current weights (with adapters: every adapter)."""
        if self.adapters:
            first = next(iter(self.engines))
            self.engines[first].sync_adapters(self.models[first], list(self.engines))
            return
        for name, engine in self.engines.items():
            engine.sync_weights(self.models[name])

    def __call__(self, step: int) -> list[Episode]:
        self.sync()
        return self.rollouts(step)

    def collect(self, step: int, tasks: Sequence[Any]) -> list[Episode]:
        """`Rollouts.collect` of some of the step's groups, after a sync."""
        self.sync()
        return self.rollouts.collect(step, tasks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rollouts, name)
