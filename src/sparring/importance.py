"""Truncated importance weights for samples drawn by another policy than the learner's.

One setting, ``algorithm.importance_correction`` (``level``, ``clip``), for two callers
(`sampler_level`, `stale_level` resolve its ``auto``). Rollout workers in async mode: a
stale batch was sampled by a behaviour policy ``mu`` (the weights a worker had, up to
``max_staleness`` updates old), whose per-token log-probs the sampler recorded
(``old_logp``); `sparring.distributed.RayRollouts.correct` reweights it. The learner
(`sparring.train.loss`): ``mu`` is the sampler itself (vLLM, or another precision), whose
log-probs differ from the learner's under the same weights. In both the learner's policy before this step's update, ``pi_old``, recomputes
the log-probs, the clipped ratio is taken against ``pi_old`` (the proximal policy of
decoupled PPO: Hilton et al., "Batch size-invariance for policy optimization", 2022), and
the advantages are reweighted by the truncated importance weight

    token level:  w_t = min(pi_old(a_t) / mu(a_t), c)
    turn level:   w_t = min(prod_{t' in turn} pi_old(a_t') / mu(a_t'), c)   for t in the turn

(truncation as in IMPALA's V-trace, Espeholt et al. 2018), computed in log space.
A turn is one contiguous run of action tokens of a row (a row of the turn layout is one
turn; a row of the trajectory layout holds several).

Shapes: ``logp_old``, ``logp_behaviour`` and ``mask`` are ``[n_rows, T]``; the weights are
``[n_rows, T]``, 1 outside the mask.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

LEVELS = ("token", "turn")


def sampler_level(level: str, *, vllm: bool, recomputed: bool) -> str:
    """The level at which the learner corrects for its sampler (``"off"``, or one of
    `LEVELS`): ``level`` where the old log-probs are the learner's recomputation (so the
    sampler's can be compared with them), ``auto`` being ``token`` on a vLLM sampler, where
    the two differ by up to 1.4-1.8 nats once a bf16-mixed learner's adapter trains
    (docs/benchmarks.md, "The sampler/learner gap with vLLM"), and off elsewhere (where
    both agree the weights are 1 and change nothing)."""
    if level == "off" or not recomputed:
        return "off"
    if level == "auto":
        return "token" if vllm else "off"
    return level


def stale_level(level: str) -> str:
    """The level at which async rollout workers' stale samples are corrected: ``level``,
    ``auto`` being ``token``."""
    return "token" if level == "auto" else level


def turn_ids(mask: Tensor) -> Tensor:
    """Per token of ``mask [n, T]``, the index of its turn (contiguous run of True) counted
    over the whole batch, row by row; -1 outside the mask."""
    m = mask.bool()
    prev = torch.zeros_like(m)
    prev[:, 1:] = m[:, :-1]
    start = m & ~prev
    ids = start.flatten().long().cumsum(0).view_as(m) - 1
    return torch.where(m, ids, torch.full_like(ids, -1))


def importance_weights(logp_old: Tensor, logp_behaviour: Tensor, mask: Tensor, *,
                       level: str = "token", clip: float = 2.0
                       ) -> tuple[Tensor, dict[str, float]]:
    """Weights ``[n, T]`` (see the module docstring) and their statistics over the units
    (tokens or turns): mean and max of the truncated weight, fraction truncated (the raw
    ratio above ``clip``)."""
    if level not in LEVELS:
        raise ValueError(f"importance weights: level={level!r}; allowed: {', '.join(LEVELS)}")
    if not clip > 0:
        raise ValueError(f"importance weights: clip={clip}; must be > 0")
    m = mask.bool()
    log_ratio = torch.where(m, logp_old.float() - logp_behaviour.float(), 0.0)
    if level == "token":
        unit_log = log_ratio[m]
        per_token = log_ratio
    else:
        ids = turn_ids(m)
        n_turns = int(ids.max()) + 1 if m.any() else 0
        unit_log = torch.zeros(n_turns, device=m.device).index_add_(0, ids[m], log_ratio[m])
        per_token = torch.zeros_like(log_ratio)
        per_token[m] = unit_log[ids[m]]
    log_c = math.log(clip)
    weights = torch.where(m, per_token.clamp(max=log_c).exp(), 1.0)
    w = unit_log.clamp(max=log_c).exp()
    stats = {"weight_mean": float(w.mean()) if w.numel() else 1.0,
             "weight_max": float(w.max()) if w.numel() else 1.0,
             "truncated": float((unit_log > log_c).float().mean()) if w.numel() else 0.0}
    return weights, stats
