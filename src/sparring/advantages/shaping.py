"""Advantage shaping, applied on top of any estimator: the SHAPERS registry.

Two kinds of shaper, both pure:

* reward-level ``fn(batch, **opts) -> TurnBatch`` with new ``reward`` (per row) and ``returns``
  (per trajectory, kept consistent): `overlong_penalty`, `kl_in_reward`. They run *before*
  the estimator.
* advantage-level ``fn(adv [n, T], batch, *, out=None, **opts) -> adv [n, T]``: `ucas`,
  `canon`, `entropy_shaping`. They run *after* the estimator, in the order given. Contract
  (as for estimators): given ``adv`` zero outside ``batch.action_mask``, the result is too,
  so `shaped` does not mask again (tests/test_estimator_contract.py checks each wrapper).
  ``out`` may be ``adv`` itself: `shaped` writes each shaper into the estimator's result,
  which the caller owns (estimator contract), so shaping allocates no second ``[n, T]``.

Row statistics and the element-wise passes walk the rows in memory blocks
(`rowblock.row_blocks`), so no full ``[n, T]`` temporary is allocated besides the output.

`shaped(batch, estimator, options, shaping)` composes them:
``shaped(b, "grpo", {}, [("kl_in_reward", {"beta": 0.1}), ("ucas", {})])``.
Each shaper is also an estimator of the same name (family "shaping") that wraps a ``base``
estimator (``base="grpo"``, ``base_options={...}``), so a config can name it directly and
``sparring list estimators`` / ``sparring list shapers`` show it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from sparring.advantages import ESTIMATORS, compute, estimator
from sparring.advantages.normalize import check_choice, scope_ids
from sparring.advantages.rowblock import keep_where, masked_row_mean, row_blocks, row_count
from sparring.data import TurnBatch
from sparring.registry import Registry
from sparring.segments import compact_ids, segment_mean, segment_median, segment_sum

SHAPERS = Registry("shaper")
KINDS = ("advantage", "reward")


def _base_keep(batch: TurnBatch, *, base: str = "grpo", base_options: Mapping | None = None,
               **_: Any) -> Tensor:
    keep_fn = ESTIMATORS.get(base).extra.get("keep")
    if keep_fn is None:
        return torch.ones(batch.n_rows, dtype=torch.bool, device=batch.device)
    return keep_fn(batch, **dict(base_options or {}))


def shaper(name: str, *, kind: str, needs: tuple[str, ...] = (), source: str = ""
           ) -> Callable[[Callable], Callable]:
    """Register a shaper in SHAPERS and, wrapped around a ``base`` estimator, in ESTIMATORS."""
    check_choice("kind", kind, KINDS)

    def deco(fn: Callable) -> Callable:
        SHAPERS.register(name, family=kind, needs=needs, source=source)(fn)

        def wrapped(batch: TurnBatch, *, base: str = "grpo",
                    base_options: Mapping | None = None, **opts: Any) -> Tensor:
            return shaped(batch, base, base_options, [(name, opts)])[0]

        wrapped.__doc__ = f"{kind}-level shaper {name!r} on top of estimator ``base``.\n\n" + (
            fn.__doc__ or "")
        estimator(name, family="shaping", needs=needs + ("base estimator",), layout="any",
                  source=source, keep=_base_keep)(wrapped)
        return fn

    return deco


def shaped(batch: TurnBatch, estimator_name: str, options: Mapping | None = None,
           shaping: Sequence[str | tuple[str, Mapping]] = ()) -> tuple[Tensor, Tensor]:
    """Reward shapers, then the estimator, then advantage shapers. Returns (adv, keep)."""
    steps = [(s, {}) if isinstance(s, str) else (s[0], dict(s[1])) for s in shaping]
    entries = [(SHAPERS.get(n), o) for n, o in steps]
    for e, o in entries:
        if e.family == "reward":
            batch = e.fn(batch, **o)
    adv, keep = compute(estimator_name, batch, **dict(options or {}))
    for e, o in entries:
        if e.family == "advantage":
            own = adv.dtype in (torch.float32, torch.float64)  # else promoted: a new tensor
            adv = e.fn(adv, batch, out=adv if own else None, **o)  # zero off-mask (contract)
    return adv, keep


def _with_row_delta(batch: TurnBatch, delta: Tensor) -> TurnBatch:
    """Add ``delta [n]`` to each row's reward and to its trajectory's return."""
    per_traj = segment_sum(delta, batch.traj, batch.n_traj)[batch.traj]
    return batch.with_fields(reward=batch.reward + delta, returns=batch.returns + per_traj)


def _out(out: Tensor | None, adv: Tensor, dtype: torch.dtype) -> Tensor:
    """The result tensor of an advantage shaper: ``out`` (checked) or a new one."""
    want = torch.promote_types(adv.dtype, dtype)
    if out is None:
        return torch.empty(adv.shape, dtype=want, device=adv.device)
    if out.shape != adv.shape or out.dtype != want:
        raise ValueError(f"out has shape {tuple(out.shape)} and dtype {out.dtype}; "
                         f"expected {tuple(adv.shape)} and {want}")
    return out


@shaper("ucas", kind="advantage", needs=("logprobs",),
        source="Uncertainty-aware Advantage Shaping (UCAS), 2025")
def ucas(adv: Tensor, batch: TurnBatch, *, alpha: float = 0.5, beta: float = 0.1,
         out: Tensor | None = None) -> Tensor:
    """``A' = A (1 + alpha (1 - c))`` where A > 0, ``A' = A (1 + alpha c) - beta p_t`` where A < 0.

    c = exp(mean_t old_logp): the response's self-confidence (geometric-mean token
    probability); p_t = exp(old_logp_t): the token's certainty. Uncertain-but-good responses
    are pushed up more, confident-but-bad ones down more, and overconfident tokens of bad
    responses get an extra penalty. Shapes ``[n, T]``. Source: UCAS (2025); the functional
    forms are our reading (the abstract names the two stages, not the formulas; we use
    sampled-token probabilities in place of raw logits).
    """
    m = batch.action_mask
    n, T = m.shape
    lp_all = batch.old_logp
    out = _out(out, adv, torch.float32)
    cnt = row_count(m).clamp(min=1)
    for b in row_blocks(n, T):  # per row block: all of it is row-local
        mb, lp = m[b], lp_all[b].float()
        a = adv[b].to(out.dtype)
        c = (keep_where(mb, lp).sum(1) / cnt[b]).exp()[:, None]
        # A (1 + alpha (1 - c)) where A >= 0; A (1 + alpha c) - beta p where A < 0. A = 0 off
        # the action tokens (shaper contract), so the first term keeps them 0. Every input
        # is read before out[b] (which may be adv[b]) is written.
        neg, pen = a.clamp(max=0), keep_where(a < 0, lp.exp()).mul_(beta)
        o = torch.mul(a.clamp(min=0), 1 + alpha * (1 - c), out=out[b])
        o.addcmul_(neg, 1 + alpha * c).sub_(pen)
    return out


METRICS = ("entropy", "length")


@shaper("canon", kind="advantage", needs=("group", "entropies|length"),
        source="Conditional Advantage Estimation (CANON), 2025")
def canon(adv: Tensor, batch: TurnBatch, *, metric: str = "entropy", weight: float = 2.0,
          scope: str = "group", out: Tensor | None = None) -> Tensor:
    """Split each group at the median of a metric; re-weight inter- vs intra-half signal.

    With a_i the row's mean advantage, h(i) its half (metric > group median or not):
    ``a'_i = (a_i - mean_h a) + weight (mean_h a - mean_g a)``; the tokens get
    ``A + (a'_i - a_i)``. ``weight = 1`` leaves A unchanged; ``> 1`` amplifies whichever
    metric trend the data favours, without presuming its direction. metric: mean token
    entropy or action length. Shapes ``[n, T]``. Source: CANON (2025); our reading.
    """
    check_choice("metric", metric, METRICS)
    m = batch.action_mask
    if metric == "entropy":
        if batch.entropy is None:
            raise ValueError("canon(metric='entropy') needs batch.entropy (token entropies)")
        x = masked_row_mean(batch.entropy.float(), m)
    else:
        x = batch.length.float()
    a = masked_row_mean(adv.float(), m)
    ids, n = scope_ids(batch, scope)
    if n == 0:
        return adv if out is None else out.copy_(adv)
    high = x > segment_median(x, ids, n)[ids]
    hid, hn = compact_ids(ids, high.long())
    mh, mg = segment_mean(a, hid, hn)[hid], segment_mean(a, ids, n)[ids]
    new = (a - mh) + weight * (mh - mg)
    delta = new - a
    out = _out(out, adv, delta.dtype)
    d = delta.to(out.dtype)[:, None]
    in_place = out.data_ptr() == adv.data_ptr()
    for b in row_blocks(*m.shape):  # A + delta on action tokens, A elsewhere
        (out[b] if in_place else out[b].copy_(adv[b])).add_(keep_where(m[b], d[b]))
    return out


@shaper("entropy_shaping", kind="advantage", needs=("entropies",),
        source="MSSR: Stable and Efficient Single-Rollout RL, 2025")
def entropy_shaping(adv: Tensor, batch: TurnBatch, *, lo: float = 0.5, hi: float = 2.0,
                    eps: float = 1e-6, out: Tensor | None = None) -> Tensor:
    """``A' = A * clip(H_i / mean_batch H, lo, hi)``, H_i the row's mean token entropy.

    Low-entropy (confident) responses get smaller updates, high-entropy ones larger, which
    regularises the advantage magnitude against entropy collapse in single-rollout (G = 1)
    training. Shapes ``[n, T]``. Source: MSSR (2025); the functional form is our reading.
    """
    if batch.entropy is None:
        raise ValueError("entropy_shaping needs batch.entropy (token entropies)")
    if not 0 < lo <= hi:
        raise ValueError(f"bad lo={lo!r}, hi={hi!r}; need 0 < lo <= hi")
    H = masked_row_mean(batch.entropy.float(), batch.action_mask)
    has = row_count(batch.action_mask) > 0
    ref = H[has].mean() if bool(has.any()) else torch.ones(())
    scale = (H / (ref + eps)).clamp(lo, hi)[:, None]
    return torch.mul(adv, scale, out=_out(out, adv, scale.dtype))


@shaper("overlong_penalty", kind="reward", needs=("length",), source="DAPO (2025)")
def overlong_penalty(batch: TurnBatch, *, max_length: int | None = None,
                     cache: int | None = None, factor: float = 1.0) -> TurnBatch:
    """DAPO soft overlong punishment added to each row's reward (and its trajectory's return).

    With L the row's action length, L_max = ``max_length`` (default: the batch width T) and
    C = ``cache`` (default L_max // 4): penalty 0 for L <= L_max - C,
    ``(L_max - C - L) / C`` for L_max - C < L <= L_max, -1 beyond; times ``factor``.
    Source: DAPO (2025).
    """
    lmax = batch.action_mask.shape[1] if max_length is None else int(max_length)
    cache_ = max(lmax // 4, 1) if cache is None else int(cache)
    if lmax <= 0 or not 0 < cache_ <= lmax:
        raise ValueError(f"bad max_length={lmax} / cache={cache_}; need 0 < cache <= max_length")
    ln = batch.length.float()
    soft = lmax - cache_
    pen = torch.where(ln <= soft, 0.0, torch.where(ln <= lmax, (soft - ln) / cache_, -1.0))
    return _with_row_delta(batch, factor * pen)


KL_KINDS = ("k1", "k2", "k3")


def token_kl(batch: TurnBatch, kind: str = "k1") -> Tensor:
    """Per-token KL(pi_old || pi_ref) estimate ``[n, T]`` (0 off action tokens).

    With d = old_logp - ref_logp: k1 = d, k2 = d^2 / 2, k3 = exp(-d) - 1 + d.
    """
    check_choice("kind", kind, KL_KINDS)
    if batch.ref_logp is None:
        raise ValueError("kl_in_reward needs batch.ref_logp (reference-model log-probs)")
    n, T = batch.action_mask.shape
    out = torch.empty(n, T, dtype=torch.float32, device=batch.action_mask.device)
    for b in row_blocks(n, T):
        d = (batch.old_logp[b] - batch.ref_logp[b]).float()
        k = d if kind == "k1" else (d.square_().mul_(0.5) if kind == "k2"
                                    else torch.expm1(-d).add_(d))
        keep_where(batch.action_mask[b], k, out=out[b])
    return out


@shaper("kl_in_reward", kind="reward", needs=("ref_logp",), source="PPO-RLHF practice "
        "(Ziegler et al. 2019; Ouyang et al. 2022)")
def kl_in_reward(batch: TurnBatch, *, beta: float = 0.05, kind: str = "k1") -> TurnBatch:
    """``r' = r - beta * sum_t KL_t`` per row (and the same total off the trajectory's return).

    For a per-token penalty inside GAE, pass ``token_rewards=-beta * token_kl(batch)`` to
    ``gae`` instead. Source: PPO-RLHF practice.
    """
    return _with_row_delta(batch, -beta * token_kl(batch, kind).sum(1))
