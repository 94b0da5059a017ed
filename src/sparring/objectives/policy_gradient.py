"""Token-level policy-gradient objectives: ppo_clip, reinforce, cispo.

Signature: ``fn(logp, old_logp, advantages, mask, *, ref_logp=None, **options) ->
(loss [n, T], diagnostics)``: the per-token loss to minimise, zero outside ``mask``, and
a dict of 0-d tensors (see `sparring.objectives`). ``logp`` carries the gradient;
``old_logp`` are the sampling log-probs; rho_t = exp(logp_t - old_logp_t), its log
clamped to +-`LOG_RATIO_CLAMP` (`sparring.objectives.common.log_ratio`).

``ppo_clip`` and ``cispo`` take ``ratio_level``: the importance ratio of each token is
its own (``token``), its turn's (``turn``) or its row's (``sequence``), the last two the
geometric mean of the token ratios over the unit (`sparring.objectives.common.unit_index`).
Turn-level ratios are ST-PPO's "turn-level importance sampling" (ST-PPO: Stabilized
Off-Policy Proximal Policy Optimization for Multi-Turn Agents Training, 2025). The
abstract does not print the formula; *our reading*: the geometric mean over the turn's
action tokens (as GSPO does for a sequence), clipped per turn with PPO's range, in
GSPO's per-token form so the advantage may still vary by token. Its clipping-bias
correction is not implemented.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparring.objectives import objective
from sparring.objectives.common import (
    check_clip,
    check_same_shape,
    clipped_surrogate,
    fraction,
    level_ratio,
    ratio_diagnostics,
)

_ST_PPO = ("turn ratio: ST-PPO: Stabilized Off-Policy Proximal Policy Optimization for "
           "Multi-Turn Agents Training (2025)")


@objective("ppo_clip", family="policy_gradient", needs=("old_logp",),
           source="Proximal Policy Optimization Algorithms (2017); dual clip: Mastering "
           "Complex Control in MOBA Games with Deep RL (2020); clip-higher: DAPO (2025); "
           + _ST_PPO)
def ppo_clip(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
             ref_logp: Tensor | None = None, eps_low: float = 0.2, eps_high: float | None = None,
             dual_clip: float | None = None, ratio_level: str = "token"
             ) -> tuple[Tensor, dict[str, Tensor]]:
    """l_t = max(-A_t rho, -A_t clip(rho, 1-eps_low, 1+eps_high)); with ``dual_clip=c``
    (> 1), l_t = min(l_t, -c A_t) where A_t < 0 (bounds the loss of negative advantages).

    rho is the ratio of token t's unit at ``ratio_level`` (module doc): at ``token`` level
    rho_t = exp(logp_t - old_logp_t) (log clamped to +-20); at ``turn`` / ``sequence`` level rho_u =
    exp(mean_{s in u} (logp_s - old_logp_s)) over the action tokens s of t's turn / row,
    in per-token form (value rho_u on each token of u, gradient rho_u d logp_t). With A
    constant over a unit, summing l_t over the unit's tokens gives |u| times the unit's
    PPO loss, in value and gradient, so every aggregation weighs it as a token-level loss.
    ``eps_high`` defaults to ``eps_low`` (DAPO's clip-higher sets it larger).

    Diagnostics, over the call's units: ``clip_frac`` (``_low``, ``_high``), the fraction
    with rho outside [1-eps_low, 1+eps_high] (below, above); ``ratio``, ``ratio_max``;
    with ``dual_clip``, ``dual_clip_frac``: the fraction of tokens the bound -c A caps.
    Shapes: all [n, T] -> [n, T]."""
    eps_high = eps_low if eps_high is None else eps_high
    check_clip("ppo_clip", eps_low=eps_low, eps_high=eps_high)
    check_same_shape("ppo_clip", logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
    ratio, rho = level_ratio(logp, old_logp, mask, ratio_level)
    loss = clipped_surrogate(ratio, advantages, eps_low, eps_high)
    diagnostics = ratio_diagnostics(rho, rho < 1 - eps_low, rho > 1 + eps_high)
    if dual_clip is not None:
        if not dual_clip > 1:
            raise ValueError(f"ppo_clip: dual_clip must be > 1, got {dual_clip!r}")
        bound = -dual_clip * advantages
        capped = (advantages < 0) & (loss.detach() > bound)
        diagnostics["dual_clip_frac"] = fraction(capped[mask.bool()])
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
    return loss * mask, diagnostics


@objective("reinforce", family="policy_gradient",
           source="Williams 1992; GPG: A Simple and Strong Reinforcement Learning Baseline")
def reinforce(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
              ref_logp: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """l_t = -A_t log pi(y_t). No ratio, no clip (on-policy), no diagnostics.
    Shapes: [n, T] -> [n, T]."""
    check_same_shape("reinforce", logp=logp, advantages=advantages, mask=mask)
    return -advantages * logp * mask, {}


@objective("cispo", family="policy_gradient", needs=("old_logp",),
           source="MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning "
           "Attention (CISPO); " + _ST_PPO)
def cispo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
          ref_logp: Tensor | None = None, eps_low: float | None = None,
          eps_high: float = 0.2, ratio_level: str = "token") -> tuple[Tensor, dict[str, Tensor]]:
    """l_t = -sg(clip(rho, 1-eps_low, 1+eps_high)) A_t log pi(y_t).

    The clipped importance weight is a constant (stop-gradient), so every token keeps
    a gradient. ``eps_low=None``: no lower bound. Default eps_high is ours. rho is the
    ratio of token t's unit at ``ratio_level``, as in `ppo_clip` (turn / sequence: the
    geometric mean of the unit's token ratios; the weight is constant, so no per-token
    form is needed). Diagnostics over the units: ``clip_frac`` (``_low``, ``_high``), the
    fraction whose weight was truncated; ``ratio``, ``ratio_max``.
    Shapes: [n, T] -> [n, T]."""
    check_clip("cispo", eps_low=eps_low, eps_high=eps_high)
    check_same_shape("cispo", logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
    ratio, rho = level_ratio(logp, old_logp, mask, ratio_level)
    lo = None if eps_low is None else 1 - eps_low
    w = ratio.detach().clamp(min=lo, max=1 + eps_high)
    low = rho < lo if lo is not None else torch.zeros_like(rho, dtype=torch.bool)
    return -w * advantages * logp * mask, ratio_diagnostics(rho, low, rho > 1 + eps_high)
