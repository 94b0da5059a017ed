"""The learner's loss over one micro-batch of rows, given the policy forward's outputs:

    L = agg(objective(logp, old_logp, A)) + c_kl * agg(KL_k(pi || ref))
        - c_ent * agg(H(pi)) + c_v * agg((V - target)^2 / 2)

``agg`` is `sparring.aggregation.aggregate` with the token / sequence counts of the whole
mini-batch (``counts``), so the gradient accumulated over micro-batches does not depend on
the micro-batch size. ``A`` is the advantage, reweighted by the truncated importance weight
min(pi_learner / pi_sampler, c) where ``algorithm.importance_correction`` is on
(`sparring.importance`); ``target`` is the game return (``critic.target: returns``) or
``A + V_old`` (``advantages_plus_values``).

The step's metrics accumulate in ``stats``: plain keys are summed per micro-batch (the
learner divides by the number of optimizer steps), ``_tok/`` keys are token sums (divided
by the step's action tokens), ``_max/`` keys are maxima over the step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from sparring.aggregation import aggregate
from sparring.importance import importance_weights
from sparring.kl import kl_estimate
from sparring.objectives import compute as objective_compute

if TYPE_CHECKING:
    from collections.abc import Collection

    from sparring.config import Config
    from sparring.data import TurnBatch

# per-row batch fields an objective may ask for in its ``needs`` (passed as options)
ROW_OPTIONS = {"group": "group", "rewards": "returns", "agent": "agent", "episode": "episode",
               "turn": "turn", "length": "length"}


def keep_max(stats: dict[str, float], name: str, value: float) -> None:
    """Record ``value`` as the step's ``name`` if it is the largest so far (``_max/``
    entries are maxima over the step, not means)."""
    stats[f"_max/{name}"] = max(stats.get(f"_max/{name}", -math.inf), value)


def micro_loss(cfg: Config, batch: TurnBatch, rows: Tensor,
               logp: Tensor, ent: Tensor, values: Tensor | None, *, adv: Tensor,
               old: Tensor | None, ref: Tensor | None, mask: Tensor, counts: dict[str, Any],
               entropy_coef: float, sampler_correction: str, objective_needs: Collection[str],
               stats: dict[str, float]) -> Tensor:
    """The loss of ``rows`` (module docstring) from their forward's log-probs ``logp``,
    entropies ``ent`` and critic ``values`` (``[r, L]``, L the rows' longest length).
    ``adv``, ``old``, ``ref``, ``mask``: the whole batch's advantages, old and reference
    log-probs and loss mask, ``[n, T]``; ``old`` None: the old log-probs are this forward's
    own, detached (one optimizer step over the batch, with ``recompute_old_logp``).
    ``objective_needs``: the objective's registered needs (which row fields it takes)."""
    a = cfg.algorithm
    L = logp.shape[1]
    m = mask[rows, :L]
    old_r = logp.detach() if old is None else old[rows, :L]
    sampled = batch.old_logp[rows, :L]  # the sampler's own (old_r: the learner's)
    explored = batch.extras.get("explored")  # moves drawn at random (exploration.learner)
    m_s = m if explored is None else m & (explored[rows] != 1.0)[:, None].to(m.device)
    sampled = torch.where(m_s, sampled, old_r)  # no sampler log-probs: no gap
    adv_r = adv[rows, :L]
    w = None
    if sampler_correction != "off":  # the sampler's log-probs differ from ours
        w, _ = importance_weights(old_r, sampled, m, level=sampler_correction,
                                  clip=a.importance_correction.clip)
        adv_r = adv_r * w
    ref_r = None if ref is None else ref[rows, :L]
    row_opts = {k: getattr(batch, f)[rows] for k, f in ROW_OPTIONS.items()
                if k in objective_needs}
    tok, diagnostics = objective_compute(a.objective, logp, old_r, adv_r, m, ref_logp=ref_r,
                                         **row_opts, **a.objective_options)

    def agg(x: Tensor) -> Tensor:
        return aggregate(x, m, a.aggregation, **counts)

    pol = agg(tok)
    total = pol
    mf = m.float()
    with torch.no_grad():
        ntok = float(mf.sum())
        stats["policy_loss"] += float(pol.detach())
        if a.recompute_old_logp:  # the sampler's log-probs against the learner's
            gap = (sampled - old_r).abs() * mf
            stats["_tok/sampler/logp_diff_mean"] += float(gap.sum())
            keep_max(stats, "sampler/logp_diff_max", float(gap.max()))
            stats["_tok/sampler/kl"] += float(kl_estimate(sampled, old_r, m, "k3").sum())
        if w is not None:
            stats["_tok/sampler/is_weight"] += float((w * mf).sum())
            keep_max(stats, "sampler/is_weight_max", float((w * mf).max()))
        # k3 of KL(pi_old || pi) on the tokens pi_old sampled
        stats["_tok/approx_kl"] += float(kl_estimate(old_r, logp, m, "k3").sum())
        if a.entropy_bonus == "entropy":
            stats["_tok/entropy"] += float((ent * mf).sum())
        elif a.entropy_bonus == "uniform_kl":  # ent holds -KL(u || pi)
            stats["_tok/uniform_kl"] -= float((ent * mf).sum())
        else:  # log of the allowed tokens' mass, 0 on free tokens (sparring.policy.forward)
            stats["_tok/allowed_mass"] += float((ent * mf).sum())
        if ntok > 0:  # the objective's own diagnostics (clip_frac, ratio, ...)
            for k, v in diagnostics.items():
                if k.endswith("_max"):  # a maximum over the step, not a mean
                    keep_max(stats, k, float(v))
                else:
                    stats[f"_tok/{k}"] += float(v) * ntok
        stats["_ntok"] += ntok
    if ref_r is not None:
        kl_tok = kl_estimate(logp, ref_r, m, a.kl.estimator)
        with torch.no_grad():
            stats["_tok/kl"] += float(kl_tok.sum())
        if a.kl.coef > 0:
            total = total + a.kl.coef * agg(kl_tok)
    if a.entropy_coef > 0:
        total = total - entropy_coef * agg(ent)
    if values is not None:
        if cfg.critic.target == "returns":
            target = batch.returns[rows, None].to(values.dtype).expand_as(values)
        else:
            if batch.values is None:
                raise ValueError("critic.target=advantages_plus_values needs batch.values")
            target = adv_r + batch.values[rows, :L]
        vl = agg(0.5 * (values - target) ** 2)
        stats["value_loss"] += float(vl.detach())
        total = total + cfg.critic.coef * vl
    stats["loss"] += float(total.detach())
    return total
