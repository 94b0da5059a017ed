"""Diagnostics of the importance ratio for logging: clip fractions and approximate KL."""

from __future__ import annotations

import torch
from torch import Tensor


@torch.no_grad()
def ratio_stats(logp: Tensor, old_logp: Tensor, mask: Tensor, eps_low: float = 0.2,
                eps_high: float | None = None) -> dict[str, float]:
    """Over the masked tokens, with rho = exp(logp - old_logp):

    * ``clip_frac``: fraction with rho outside [1-eps_low, 1+eps_high] (``_low``/``_high``:
      below / above);
    * ``approx_kl``: mean of k3 = (rho - 1) - log rho, an estimate of KL(pi_old || pi);
    * ``ratio_mean``, ``ratio_max``.
    """
    eps_high = eps_low if eps_high is None else eps_high
    m = mask.bool()
    if logp.shape != old_logp.shape or logp.shape != m.shape:
        raise ValueError("ratio_stats: logp, old_logp and mask must have one shape")
    d = (logp - old_logp)[m].double()
    if d.numel() == 0:
        return dict(clip_frac=0.0, clip_frac_low=0.0, clip_frac_high=0.0, approx_kl=0.0,
                    ratio_mean=1.0, ratio_max=1.0)
    rho = d.exp()
    low = (rho < 1 - eps_low).double().mean()
    high = (rho > 1 + eps_high).double().mean()
    return dict(clip_frac=float(low + high), clip_frac_low=float(low),
                clip_frac_high=float(high), approx_kl=float((rho - 1 - d).mean()),
                ratio_mean=float(rho.mean()), ratio_max=float(rho.max()))
