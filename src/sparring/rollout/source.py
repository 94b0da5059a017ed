"""What the training loop takes as its rollouts: a `RolloutSource` (``step -> episodes``),
and the two hooks a source may also offer, each a `typing.Protocol` the loop checks with
``isinstance``:

- `CorrectsStaleSamples`: ``correct(step, batch, advantages, learner)`` after the advantage
  stage, once per policy with that policy's rows and learner, returning its batch,
  advantages and the correction's metrics (async rollout workers: the truncated
  importance weights of samples drawn with older weights);
- `ReportsRolloutMetrics`: ``rollout_metrics()`` after each rollout, the step's metrics of
  the rollout machinery (rollout workers: restarts, weight sync and play times, staleness);
- `ReportsLeague`: ``league_metrics()`` after each step (the opponent pool's scores).

A plain function is a source with neither hook. `sparring.rollout.rollouts.Rollouts`
and `sparring.distributed.rollouts.RayRollouts` are the built-in sources.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor

    from sparring.data import Episode, TurnBatch


class RolloutSource(Protocol):
    def __call__(self, step: int) -> Sequence[Episode]:
        """The episodes of training step ``step`` (0-based)."""
        ...


@runtime_checkable
class CorrectsStaleSamples(Protocol):
    def correct(self, step: int, batch: TurnBatch, adv: Tensor,
                learner: Any) -> tuple[TurnBatch, Tensor, dict[str, float]]:
        """``(batch, advantages, metrics)`` for one policy's update (its rows, its
        learner), after the advantage stage."""
        ...


@runtime_checkable
class ReportsRolloutMetrics(Protocol):
    def rollout_metrics(self) -> dict[str, float]:
        """The rollout machinery's metrics of the step just played."""
        ...


@runtime_checkable
class ReportsLeague(Protocol):
    def league_metrics(self) -> dict[str, float]:
        """The league's metrics of the step just played (``league/...``)."""
        ...
