"""Advantage estimators: the ESTIMATORS registry and the functional API.

Every estimator is a pure function ``fn(batch: TurnBatch, **options) -> Tensor[n_rows, T]``
(zero outside ``batch.action_mask``), registered with `estimator`. Some estimators also
exclude rows from the loss (``mc_grpo``'s pivot, group filters): they register a
``keep`` function ``keep(batch, **options) -> Bool[n_rows]``; `compute` returns both.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from sparring.data import TurnBatch
from sparring.registry import Registry

ESTIMATORS = Registry("estimator")

# Modules whose import registers estimators (one per family).
_FAMILY_MODULES = ("group", "turn", "critic", "shaping")


def estimator(
    name: str,
    *,
    family: str,
    needs: tuple[str, ...] = (),
    layout: str = "any",
    source: str = "",
    keep: Callable[..., Tensor] | None = None,
) -> Callable[[Callable], Callable]:
    """Register ``fn(batch, **options) -> Tensor[n, T]`` under ``name``.

    Contract: the result is exactly zero outside ``batch.action_mask`` (`compute` does not
    mask again; tests/test_estimator_contract.py checks every registered estimator).

    ``layout``: "any" (works on turn and trajectory rows), "turn" or "trajectory".
    ``needs``: what the batch must carry (group, agent, turn, state_key, logprobs,
    entropies, values, references, ...), shown by ``sparring list estimators``.
    """
    def deco(fn: Callable) -> Callable:
        writes_out = "out" in inspect.signature(fn).parameters
        return ESTIMATORS.register(name, family=family, needs=needs, layout=layout,
                                   source=source, keep=keep, writes_out=writes_out)(fn)

    return deco


def _load_families() -> None:
    for mod in _FAMILY_MODULES:
        try:
            importlib.import_module(f"sparring.advantages.{mod}")
        except ModuleNotFoundError as e:  # a family not written yet
            if e.name != f"sparring.advantages.{mod}":
                raise


def _batch_for(
    name: str, data: TurnBatch | Tensor | Sequence[float], group, agent, lengths
) -> tuple[TurnBatch, bool]:
    if isinstance(data, TurnBatch):
        return data, False
    return TurnBatch.from_scalars(data, group=group, agent=agent, lengths=lengths), True


def compute(name: str, batch: TurnBatch, *, out: Tensor | None = None,
            **options: Any) -> tuple[Tensor, Tensor]:
    """Advantages ``[n, T]`` (zero outside the action mask) and the rows kept for the loss
    ``Bool[n]``.

    ``out``: a float ``[n, T]`` tensor to write the advantages into (and return), e.g. a
    buffer a trainer reuses across steps so that no fresh ``[n, T]`` result is paged in.
    Estimators that take an ``out`` argument (the trajectory-level ones) write into it
    directly; for the others the result is copied into it."""
    _load_families()
    entry = ESTIMATORS.get(name)
    if entry.layout not in ("any", batch.layout):
        raise ValueError(f"estimator {name!r} needs layout={entry.layout!r}, "
                         f"got a batch collated with layout={batch.layout!r}")
    if out is not None and (out.shape != batch.action_mask.shape or not out.is_floating_point()):
        raise ValueError(f"out has shape {tuple(out.shape)} and dtype {out.dtype}; expected "
                         f"a float tensor of shape {tuple(batch.action_mask.shape)}")
    if out is not None and entry.extra.get("writes_out"):
        adv = entry.fn(batch, out=out, **options)
    else:
        adv = entry.fn(batch, **options)
        if out is not None:
            adv = out.copy_(adv)
    keep_fn = entry.extra.get("keep")
    keep = (keep_fn(batch, **options) if keep_fn is not None
            else torch.ones(batch.n_rows, dtype=torch.bool, device=batch.device))
    # every estimator returns zeros outside the action mask (tests/test_estimator_contract.py
    # checks each registered one), so no second pass over [n, T] here
    return adv, keep


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
    * ``estimate(name, batch: TurnBatch, **options) -> Tensor[n_rows, T]``.
    """
    batch, scalar = _batch_for(name, data, group, agent, lengths)
    adv, keep = compute(name, batch, **options)
    adv = adv * keep[:, None]
    return adv[:, 0] if scalar else adv


def list_estimators() -> list:
    _load_families()
    return list(ESTIMATORS)
