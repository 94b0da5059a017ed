"""A single-seat task on held-out instances: ``evaluate_task``.

The policy plays ``n`` episodes of the task from seeds ``seed .. seed + n - 1`` (by default
`HELD_OUT_SEED` on, which no training run draws: a run's training seeds are its step and
episode counters), one episode per seed, with ``sampling`` (greedy in the periodic
evaluation). Reported over the episodes:

* ``mean_return`` (penalties included) and ``success``, the share with an env return
  ``> 0``, with its Wilson 95% interval (``success_lo``, ``success_hi``);
* ``invalid_rate`` (the share of turns the env could not read), ``forfeit_rate`` and
  ``turns`` (per episode);
* for every number (or bool) in the info of the step that ended an episode
  (``Episode.info["outcome"]``, e.g. the calculator's ``correct``, ``used_tool``), its mean
  over all ``n`` episodes; an episode that ended without one (a forfeit) counts 0, and the
  env's ``outcome_keys`` are reported even when every episode forfeits.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Real
from typing import Any

from sparring.data import Episode
from sparring.envs import make
from sparring.eval.stats import wilson
from sparring.policy.sampling import SamplingParams
from sparring.rollout.arena import Arena
from sparring.rollout.players import ModelPlayer

HELD_OUT_SEED = 1_000_000


def evaluate_task(arena: Arena, policy: Any, sampling: SamplingParams, env: str,
                  options: dict[str, Any], n: int, seed: int = HELD_OUT_SEED
                  ) -> dict[str, float]:
    """See the module docstring. ``env`` must have one seat."""
    if n < 1:
        raise ValueError(f"episodes: must be >= 1, got {n}")
    task = make(env, **options)
    if task.num_seats != 1:
        raise ValueError(f"evaluate_task: {env!r} has {task.num_seats} seats; a task has one "
                         "(games are evaluated against eval.opponents)")
    keys = getattr(task, "outcome_keys", ())
    me = ModelPlayer(policy, name="eval", train=False, sampling=sampling)
    return task_metrics(arena.run_episodes(env, dict(options), seeds=[seed + i for i in range(n)],
                                           seat_players=me), keys)


def task_metrics(eps: Sequence[Episode], keys: Sequence[str] = ()) -> dict[str, float]:
    """The module docstring's metrics over finished single-seat episodes ``eps``; each of
    ``keys`` (the env's ``outcome_keys``) is reported, 0 where no episode gave it."""
    n = len(eps)
    if n < 1:
        raise ValueError("task_metrics: no episodes")
    successes = sum(ep.info["env_returns"][0] > 0 for ep in eps)
    turns = sum(len(ep.turns) for ep in eps)
    lo, hi = wilson(successes, n)
    out = {"episodes": float(n), "mean_return": sum(ep.returns[0] for ep in eps) / n,
           "success": successes / n, "success_lo": lo, "success_hi": hi,
           "invalid_rate": sum(t.invalid is not None for ep in eps for t in ep.turns)
           / max(turns, 1),
           "forfeit_rate": sum("forfeit" in ep.info for ep in eps) / n, "turns": turns / n}
    totals: dict[str, float] = {k: 0.0 for k in keys if k not in out}
    for ep in eps:
        for k, v in ep.info.get("outcome", {}).items():
            if isinstance(v, Real) and k not in out:
                totals[k] = totals.get(k, 0.0) + float(v)
    out.update({k: v / n for k, v in totals.items()})
    return out


__all__ = ["HELD_OUT_SEED", "evaluate_task", "task_metrics"]
