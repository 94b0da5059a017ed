"""Helpers the estimator families share: option checks, truncation, per-row rewards,
broadcasting a per-row value to tokens, and whitening."""

from __future__ import annotations

import torch
from torch import Tensor

from sparring.data import TurnBatch
from sparring.segments import has_spread, segment_mean, segment_std

TRUNCATION = ("mask", "terminal")


def check_choice(name: str, value: object, allowed: tuple) -> None:
    """Raise a ValueError naming the option and the allowed values."""
    if value not in allowed:
        raise ValueError(f"bad {name}={value!r}; allowed: {', '.join(map(repr, allowed))}")


def keep_rows(batch: TurnBatch, truncated: str = "mask", **_: object) -> Tensor:
    """``Bool[n_rows]``: the rows that enter statistics and the loss.

    ``truncated="mask"`` leaves out the rows of episodes stopped by a turn budget (their
    outcome is unknown); ``"terminal"`` treats a truncation as a normal episode end.
    Registered as the ``keep`` function of the estimators that take ``truncated``.
    """
    check_choice("truncated", truncated, TRUNCATION)
    if truncated == "mask":
        return ~batch.truncated.bool()
    return torch.ones(batch.n_rows, dtype=torch.bool, device=batch.device)


def turn_rewards(batch: TurnBatch, add_return: bool = False) -> Tensor:
    """Per-row reward ``[n_rows]``: the turn's reward, plus the agent's final return
    (``batch.returns``) on its last turn with ``add_return``."""
    r = batch.reward.float()
    return r + batch.returns.float() * batch.last if add_return else r


def to_tokens(batch: TurnBatch, x: Tensor) -> Tensor:
    """Broadcast a per-row value ``x [n_rows]`` to the row's action tokens: float32
    ``[n_rows, T]``, zero outside ``batch.action_mask``."""
    return torch.where(batch.action_mask, x.float()[:, None], 0.0)


def whiten(x: Tensor, eps: float, ids: Tensor | None = None, n: int = 1) -> Tensor:
    """``(x - mean_s x) / (std_s x + eps)`` within each segment s (``ids [m]``, n of them;
    one segment when None); std unbiased. Exactly 0 in a segment whose values are all
    equal (a single value included). Shapes: ``x [m]`` -> ``[m]``."""
    if ids is None:
        ids = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
    mean = segment_mean(x, ids, n)[ids]
    std = segment_std(x, ids, n)[ids]
    return torch.where(has_spread(x, ids, n)[ids], (x - mean) / (std + eps), 0.0)
