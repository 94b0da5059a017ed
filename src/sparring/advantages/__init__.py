"""Advantage estimators: the ESTIMATORS registry and the functional API.

Every estimator is a pure function ``fn(batch: TurnBatch, **options) -> Tensor[n_rows, T]``
(zero outside ``batch.action_mask``), registered with `estimator`. What else an estimator
has is declared in its registry entry, never special-cased by name elsewhere:

* ``keep(batch, **options) -> Bool[n_rows]``: rows excluded from the loss (``mc_grpo``'s
  pivot, truncated episodes); `compute` returns it beside the advantages.
* ``state``: a class whose no-argument instance carries state across training steps
  (``state_dict`` / ``load_state_dict``), passed to the estimator as ``state=`` (e.g.
  ``role_ema``'s running baselines). `sparring.advantages.stage.AdvantageStage` owns it.
* ``needs``: what the batch must carry; the learner supplies ``values`` (a critic),
  ``utterance_critic`` (ArCHer's twin Q/V outputs), ``ref_logp`` and ``entropies``.

The stage (`stage.AdvantageStage`) is the one path a trainer takes from a batch to
``(advantages, keep)``: reward shapers, the estimator, advantage shapers, keep filters.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from sparring.data import TurnBatch
from sparring.registry import Registry

ESTIMATORS = Registry("estimator")


def estimator(
    name: str,
    *,
    family: str,
    needs: tuple[str, ...] = (),
    layout: str = "any",
    source: str = "",
    keep: Callable[..., Tensor] | None = None,
    state: type | None = None,
) -> Callable[[Callable], Callable]:
    """Register ``fn(batch, **options) -> Tensor[n, T]`` under ``name``.

    Contract: the result is exactly zero outside ``batch.action_mask`` (`compute` does not
    mask again; tests/test_estimator_contract.py checks every registered estimator).

    ``layout``: "any" (works on turn and trajectory rows), "turn" or "trajectory".
    ``needs``: what the batch must carry (group, agent, turn, state_key, logprobs,
    entropies, values, utterance_critic, ...), shown by ``sparring list estimators``.
    ``keep`` and ``state``: see the module doc.
    """
    return ESTIMATORS.register(name, family=family, needs=needs, layout=layout,
                               source=source, keep=keep, state=state)


def compute(name: str, batch: TurnBatch, **options: Any) -> tuple[Tensor, Tensor]:
    """Advantages ``[n, T]`` (zero outside the action mask) and the rows kept for the loss
    ``Bool[n]``. Options are the estimator's keyword options (``state=`` included)."""
    entry = ESTIMATORS.get(name)
    if entry.layout not in ("any", batch.layout):
        raise ValueError(f"estimator {name!r} needs layout={entry.layout!r}, "
                         f"got a batch collated with layout={batch.layout!r}")
    adv = entry.fn(batch, **options)
    keep_fn = entry.extra.get("keep")
    if keep_fn is None:
        return adv, torch.ones(batch.n_rows, dtype=torch.bool, device=batch.device)
    return adv, keep_fn(batch, **{k: v for k, v in options.items() if k != "state"})


def estimate(
    name: str,
    data: TurnBatch | Tensor | Sequence[float],
    group: Tensor | Sequence[int] | None = None,
    agent: Tensor | Sequence[int] | None = None,
    lengths: Tensor | Sequence[int] | None = None,
    **options: Any,
) -> Tensor:
    """The functional API.

    * ``estimate(name, rewards, group=..., agent=None, **options) -> Tensor[n]``: one scalar
      reward per rollout (trajectory-level estimators); rows excluded from the loss get 0.
      With ``agent`` given, statistics are per (group, agent).
    * ``estimate(name, batch: TurnBatch, **options) -> Tensor[n_rows, T]``.
    """
    scalar = not isinstance(data, TurnBatch)
    batch = TurnBatch.from_scalars(data, group=group, agent=agent, lengths=lengths) \
        if scalar else data
    adv, keep = compute(name, batch, **options)
    adv = adv * keep[:, None]
    return adv[:, 0] if scalar else adv


def list_estimators() -> list:
    return list(ESTIMATORS)


# the families register their estimators and shapers on import (after `estimator` exists)
for _family in ("group", "turn", "turn_dense", "gae", "shaping", "filters"):
    importlib.import_module(f"sparring.advantages.{_family}")
