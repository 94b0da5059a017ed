"""Token-level policy-gradient objectives: ppo_clip, reinforce, cispo.

Signature: ``fn(logp, old_logp, advantages, mask, *, ref_logp=None, **options) ->
Tensor[n, T]``, the per-token loss to minimise, zero outside ``mask``. ``logp`` carries
the gradient; ``old_logp`` are the sampling log-probs; rho_t = exp(logp_t - old_logp_t).
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparring.objectives import objective
from sparring.objectives.common import check_clip, check_same_shape


@objective("ppo_clip", family="policy_gradient", needs=("old_logp",),
           source="Proximal Policy Optimization Algorithms (2017); dual clip: Mastering "
           "Complex Control in MOBA Games with Deep RL (2020); clip-higher: DAPO (2025)")
def ppo_clip(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
             ref_logp: Tensor | None = None, eps_low: float = 0.2, eps_high: float | None = None,
             dual_clip: float | None = None) -> Tensor:
    """l_t = max(-A rho, -A clip(rho, 1-eps_low, 1+eps_high)); with ``dual_clip=c`` (> 1),
    l_t = min(l_t, -c A) where A < 0 (bounds the loss of negative advantages).

    ``eps_high`` defaults to ``eps_low`` (DAPO's clip-higher sets it larger).
    Shapes: all [n, T] -> [n, T]."""
    eps_high = eps_low if eps_high is None else eps_high
    check_clip("ppo_clip", eps_low=eps_low, eps_high=eps_high)
    check_same_shape("ppo_clip", logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
    ratio = torch.exp(logp - old_logp)
    loss = torch.maximum(-advantages * ratio,
                         -advantages * ratio.clamp(1 - eps_low, 1 + eps_high))
    if dual_clip is not None:
        if not dual_clip > 1:
            raise ValueError(f"ppo_clip: dual_clip must be > 1, got {dual_clip!r}")
        loss = torch.where(advantages < 0, torch.minimum(loss, -dual_clip * advantages), loss)
    return loss * mask


@objective("reinforce", family="policy_gradient",
           source="Williams 1992; GPG: A Simple and Strong Reinforcement Learning Baseline")
def reinforce(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
              ref_logp: Tensor | None = None) -> Tensor:
    """l_t = -A_t log pi(y_t). No ratio, no clip (on-policy). Shapes: [n, T] -> [n, T]."""
    check_same_shape("reinforce", logp=logp, advantages=advantages, mask=mask)
    return -advantages * logp * mask


@objective("cispo", family="policy_gradient", needs=("old_logp",),
           source="MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning "
           "Attention (CISPO)")
def cispo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
          ref_logp: Tensor | None = None, eps_low: float | None = None,
          eps_high: float = 0.2) -> Tensor:
    """l_t = -sg(clip(rho_t, 1-eps_low, 1+eps_high)) A_t log pi(y_t).

    The clipped importance weight is a constant (stop-gradient), so every token keeps
    a gradient. ``eps_low=None``: no lower bound. Default eps_high is ours.
    Shapes: [n, T] -> [n, T]."""
    check_clip("cispo", eps_low=eps_low, eps_high=eps_high)
    check_same_shape("cispo", logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
    ratio = torch.exp(logp - old_logp).detach()
    lo = None if eps_low is None else 1 - eps_low
    w = ratio.clamp(min=lo, max=1 + eps_high)
    return -w * advantages * logp * mask
