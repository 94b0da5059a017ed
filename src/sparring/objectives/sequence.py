"""Sequence-level ratio objectives: gspo, gmpo.

Both are written in a per-token form whose value on every token of sequence i is the
sequence loss L_i (when A is constant over the sequence) and whose gradient, summed
over the tokens and divided by |y_i|, is the gradient of L_i. Aggregate with
``seq-mean-token-mean`` to get mean_i L_i exactly as in the papers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparring.objectives import objective
from sparring.objectives.common import check_clip, check_same_shape, seq_mean


def _token_form(log_seq: Tensor, tok: Tensor) -> Tensor:
    """Value exp(log_seq) on each token, gradient exp(log_seq) * d tok_t."""
    return torch.exp(log_seq.detach()[:, None] + tok - tok.detach())


@objective("gspo", family="sequence", needs=("old_logp",),
           source="Group Sequence Policy Optimization (GSPO), 2025")
def gspo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
         ref_logp: Tensor | None = None, eps_low: float = 3e-4, eps_high: float = 4e-4) -> Tensor:
    """s_i = exp(mean_t (logp - old_logp)) (length-normalised sequence ratio);
    l_t = max(-A_t s_i, -A_t clip(s_i, 1-eps_low, 1+eps_high)) in the GSPO-token form
    s_it = sg(s_i) pi(y_t)/sg(pi(y_t)). Shapes: [n, T] -> [n, T]."""
    check_clip("gspo", eps_low=eps_low, eps_high=eps_high)
    check_same_shape("gspo", logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
    s = _token_form(seq_mean(logp - old_logp, mask), logp)
    loss = torch.maximum(-advantages * s, -advantages * s.clamp(1 - eps_low, 1 + eps_high))
    return loss * mask


@objective("gmpo", family="sequence", needs=("old_logp",),
           source="Geometric-Mean Policy Optimization (GMPO), 2025")
def gmpo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
         ref_logp: Tensor | None = None, eps_low: float = 0.4, eps_high: float = 0.4) -> Tensor:
    """L_i = -A_i exp(mean_t c_t): the geometric mean of token ratios, each clipped in log
    space, pessimistically: c_t = sgn(A) min(sgn(A) d_t, sgn(A) clip(d_t, -eps_low,
    eps_high)), d_t = logp_t - old_logp_t. Per-token form (see module doc).
    Shapes: [n, T] -> [n, T]."""
    check_clip("gmpo", eps_low=eps_low, eps_high=eps_high)
    check_same_shape("gmpo", logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
    d = logp - old_logp
    sgn = torch.where(advantages < 0, -1.0, 1.0).to(d.dtype)
    c = sgn * torch.minimum(sgn * d, sgn * d.clamp(-eps_low, eps_high))
    return -advantages * _token_form(seq_mean(c, mask), c) * mask
