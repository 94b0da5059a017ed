"""Sequence-level ratio objectives: gspo, gmpo.

Both are written in a per-token form (`sparring.objectives.common.token_form`) whose
value on every token of sequence i is the sequence loss L_i (when A is constant over the
sequence) and whose gradient, summed over the tokens and divided by |y_i|, is the
gradient of L_i. Aggregate with ``seq-mean-token-mean`` to get mean_i L_i exactly as in
the papers. Token log ratios are clamped to +-`LOG_RATIO_CLAMP` before exp
(`sparring.objectives.common.log_ratio`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparring.objectives import objective
from sparring.objectives.common import (
    check_clip,
    check_same_shape,
    clipped_surrogate,
    level_ratio,
    log_ratio,
    ratio_diagnostics,
    seq_mean,
    token_form,
)


@objective("gspo", family="sequence", needs=("old_logp",),
           source="Group Sequence Policy Optimization (GSPO), 2025")
def gspo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
         ref_logp: Tensor | None = None, eps_low: float = 3e-4, eps_high: float = 4e-4
         ) -> tuple[Tensor, dict[str, Tensor]]:
    """s_i = exp(mean_t (logp - old_logp)) (length-normalised sequence ratio);
    l_t = max(-A_t s_i, -A_t clip(s_i, 1-eps_low, 1+eps_high)) in the GSPO-token form
    s_it = sg(s_i) pi(y_t)/sg(pi(y_t)). Diagnostics over the sequences (rows with an
    action token): ``clip_frac`` (``_low``, ``_high``), the fraction with s_i outside the
    clip range; ``ratio``, ``ratio_max`` of s_i. Shapes: [n, T] -> [n, T]."""
    check_clip("gspo", eps_low=eps_low, eps_high=eps_high)
    check_same_shape("gspo", logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
    s, s_i = level_ratio(logp, old_logp, mask, "sequence")
    loss = clipped_surrogate(s, advantages, eps_low, eps_high)
    return loss * mask, ratio_diagnostics(s_i, s_i < 1 - eps_low, s_i > 1 + eps_high)


@objective("gmpo", family="sequence", needs=("old_logp",),
           source="Geometric-Mean Policy Optimization (GMPO), 2025")
def gmpo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
         ref_logp: Tensor | None = None, eps_low: float = 0.4, eps_high: float = 0.4
         ) -> tuple[Tensor, dict[str, Tensor]]:
    """L_i = -A_i exp(mean_t c_t): the geometric mean of token ratios, each clipped in log
    space, pessimistically: c_t = sgn(A) min(sgn(A) d_t, sgn(A) clip(d_t, -eps_low,
    eps_high)), d_t = logp_t - old_logp_t. Per-token form (see module doc).

    Diagnostics: ``clip_frac`` (``_low``, ``_high``), the fraction of action tokens whose
    log ratio the clip changed (raised, lowered); ``ratio``, ``ratio_max`` of the
    unclipped sequence ratios exp(mean_t d_t) over the rows with an action token.
    Shapes: [n, T] -> [n, T]."""
    check_clip("gmpo", eps_low=eps_low, eps_high=eps_high)
    check_same_shape("gmpo", logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
    d = log_ratio(logp, old_logp)
    sgn = torch.where(advantages < 0, -1.0, 1.0).to(d.dtype)
    c = sgn * torch.minimum(sgn * d, sgn * d.clamp(-eps_low, eps_high))
    loss = -advantages * token_form(seq_mean(c, mask), c)
    with torch.no_grad():
        m, rows = mask.bool(), mask.bool().any(1)
        s_i = seq_mean(d, mask)[rows].exp()
        diagnostics = ratio_diagnostics(s_i, (c > d)[m], (c < d)[m])
    return loss * mask, diagnostics
