"""Shaping around any estimator: the SHAPERS registry.

Three kinds, each a pure function, applied by `stage.AdvantageStage` in this order:

* ``reward``: ``fn(batch, **opts) -> TurnBatch`` with a new per-row ``reward`` and the
  per-trajectory ``returns`` kept consistent; runs *before* the estimator
  (`overlong_penalty`, `kl_in_reward`, `loss_aversion`).
* ``advantage``: ``fn(adv [n, T], batch, **opts) -> adv [n, T]``; runs *after* the
  estimator, on its result, in the order configured (`ucas`, `canon`, `entropy_shaping`).
  Given ``adv`` zero outside ``batch.action_mask``, the result is too.
* ``keep``: ``fn(adv [n, T], batch, **opts) -> Bool[n]``: rows to keep in the loss, ANDed
  with the estimator's own keep mask (`filters.py`: DAPO dynamic sampling, CPPO pruning).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from sparring.advantages.common import check_choice
from sparring.advantages.normalize import scope_ids
from sparring.data import TurnBatch
from sparring.kl import kl_estimate
from sparring.registry import Registry
from sparring.segments import compact_ids, segment_mean, segment_median, segment_sum

SHAPERS = Registry("shaper")
KINDS = ("reward", "advantage", "keep")


def shaper(name: str, *, kind: str, needs: tuple[str, ...] = (), source: str = ""
           ) -> Callable[[Callable], Callable]:
    """Register a shaper of ``kind`` (see the module doc) in SHAPERS."""
    check_choice("kind", kind, KINDS)
    return SHAPERS.register(name, family=kind, needs=needs, source=source)


def row_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x [n, T]`` over each row's masked tokens ``[n]`` (0 for rows with none)."""
    m = mask.to(x.dtype)
    return (x * m).sum(1) / m.sum(1).clamp(min=1)


def with_row_delta(batch: TurnBatch, delta: Tensor) -> TurnBatch:
    """Add ``delta [n]`` to each row's reward and to its trajectory's return."""
    per_traj = segment_sum(delta, batch.traj, batch.n_traj)[batch.traj]
    return batch.with_fields(reward=batch.reward + delta, returns=batch.returns + per_traj)


@shaper("ucas", kind="advantage", needs=("logprobs",),
        source="Uncertainty-aware Advantage Shaping (UCAS), 2025")
def ucas(adv: Tensor, batch: TurnBatch, *, alpha: float = 0.5, beta: float = 0.1) -> Tensor:
    """``A' = A (1 + alpha (1 - c))`` where A > 0, ``A' = A (1 + alpha c) - beta p_t`` where A < 0.

    c = exp(mean_t old_logp): the response's self-confidence (geometric-mean token
    probability); p_t = exp(old_logp_t): the token's certainty. Uncertain-but-good responses
    are pushed up more, confident-but-bad ones down more, and overconfident tokens of bad
    responses get an extra penalty. Shapes ``[n, T]``. Source: UCAS (2025); the functional
    forms are our reading (the abstract names the two stages, not the formulas; we use
    sampled-token probabilities in place of raw logits).
    """
    lp = batch.old_logp.float()
    c = row_mean(lp, batch.action_mask).exp()[:, None]
    a = adv.float()
    pos = a.clamp(min=0) * (1 + alpha * (1 - c))
    neg = a.clamp(max=0) * (1 + alpha * c) - beta * lp.exp() * (a < 0)
    return pos + neg


METRICS = ("entropy", "length")


@shaper("canon", kind="advantage", needs=("group", "entropies"),
        source="Conditional Advantage Estimation (CANON), 2025")
def canon(adv: Tensor, batch: TurnBatch, *, metric: str = "entropy", weight: float = 2.0,
          scope: str = "group") -> Tensor:
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
        x = row_mean(batch.entropy.float(), m)
    else:
        x = batch.length.float()
    a = row_mean(adv.float(), m)
    ids, n = scope_ids(batch, scope)
    if n == 0:
        return adv
    high = x > segment_median(x, ids, n)[ids]
    hid, hn = compact_ids(ids, high.long())
    mean_h, mean_g = segment_mean(a, hid, hn)[hid], segment_mean(a, ids, n)[ids]
    delta = (a - mean_h) + weight * (mean_h - mean_g) - a
    return adv + delta[:, None] * m


@shaper("entropy_shaping", kind="advantage", needs=("entropies",),
        source="MSSR: Stable and Efficient Single-Rollout RL, 2025")
def entropy_shaping(adv: Tensor, batch: TurnBatch, *, lo: float = 0.5, hi: float = 2.0,
                    eps: float = 1e-6) -> Tensor:
    """``A' = A * clip(H_i / mean_batch H, lo, hi)``, H_i the row's mean token entropy
    (the batch mean over rows with action tokens).

    Low-entropy (confident) responses get smaller updates, high-entropy ones larger, which
    regularises the advantage magnitude against entropy collapse in single-rollout (G = 1)
    training. Shapes ``[n, T]``. Source: MSSR (2025); the functional form is our reading.
    """
    if batch.entropy is None:
        raise ValueError("entropy_shaping needs batch.entropy (token entropies)")
    if not 0 < lo <= hi:
        raise ValueError(f"bad lo={lo!r}, hi={hi!r}; need 0 < lo <= hi")
    H = row_mean(batch.entropy.float(), batch.action_mask)
    has = batch.action_mask.any(1)
    ref = H[has].mean() if bool(has.any()) else torch.ones(())
    return adv * (H / (ref + eps)).clamp(lo, hi)[:, None]


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
    return with_row_delta(batch, factor * pen)


@shaper("kl_in_reward", kind="reward", needs=("ref_logp",), source="PPO-RLHF practice "
        "(Ziegler et al. 2019; Ouyang et al. 2022)")
def kl_in_reward(batch: TurnBatch, *, beta: float = 0.05, kind: str = "k1") -> TurnBatch:
    """``r' = r - beta * sum_t KL_t`` per row (and the same total off the trajectory's
    return), KL_t the `sparring.kl` estimate ``kind`` of KL(pi_old || pi_ref) on the row's
    action tokens. For a per-token penalty inside GAE, pass
    ``token_rewards=-beta * kl_estimate(old_logp, ref_logp, mask, kind)`` to ``gae``.
    Source: PPO-RLHF practice."""
    if batch.ref_logp is None:
        raise ValueError("kl_in_reward needs batch.ref_logp (reference-model log-probs)")
    kl = kl_estimate(batch.old_logp.float(), batch.ref_logp.float(), batch.action_mask, kind)
    return with_row_delta(batch, -beta * kl.sum(1))


@shaper("loss_aversion", kind="reward", source="Prospect theory's loss aversion "
        "(Kahneman & Tversky 1979)")
def loss_aversion(batch: TurnBatch, *, weight: float = 2.0) -> TurnBatch:
    """``r' = r + (weight - 1) * min(r, 0)`` per row: a negative reward counts ``weight``
    times, a positive one once (and the trajectory's return follows).

    With a game's outcome as its reward (win +1, draw 0, loss -1) the learner maximises
    ``P(win) - weight * P(loss)``: a line that wins more often against weak opponents but
    loses against a good one stops paying, so play leans to the lines that do not lose
    (in self-play both seats are averse, so the game is no longer zero-sum for the
    learner). ``weight = 1`` leaves rewards unchanged. Loss aversion is prospect theory's
    (losses weigh about twice as much as gains); its use as a reward transform for
    non-loss play is our reading, not the paper's.
    """
    if weight < 1:
        raise ValueError(f"bad weight={weight!r}; need weight >= 1 (1: no change)")
    return with_row_delta(batch, (weight - 1.0) * batch.reward.clamp(max=0.0))


@shaper("positive_signalling", kind="reward", needs=("logprobs",),
        source="Biases for Emergent Communication in Multi-agent Reinforcement Learning "
        "(Eccles et al., NeurIPS 2019): positive signalling")
def positive_signalling(batch: TurnBatch, *, beta: float = 0.1, conditional: float = 1.0,
                        seats: list[int] | None = None) -> TurnBatch:
    """A bonus for messages that tell a seat's inputs apart, added to each row's reward
    (and its trajectory's return):

        r' = r + beta * (conditional * log pi(m | x) - log p(m))

    on the rows of ``seats`` (default: every row), ``m`` the row's action tokens,
    ``log pi(m | x)`` their sampled log-probability (the sum of ``old_logp``), and ``p(m)``
    the fraction of the batch's rows of the same environment and seat that sent exactly
    ``m``. Averaged over ``m ~ pi(. | x)`` and the inputs, the bonus is
    ``beta * (H(M) - conditional * H(M | X))``: with ``conditional = 1`` the mutual
    information ``I(M; X)`` between the seat's input and its message, with ``0`` the
    entropy of its messages over the batch alone; ``p`` is the batch's plug-in estimate of
    the marginal ``E_x pi(m | x)``.

    Eccles et al. raise the same mutual information with a loss on whole message
    distributions, ``H(mean_x pi(. | x)) - (H(pi(. | x)) - H_target)^2``. A reward from the
    sampled messages is our reading: any estimator can use it and it needs no extra
    forward, but it has no target entropy: the ``H(M | X)`` term makes each input's message
    deterministic early (``conditional < 1`` weakens it; their target entropy has the same
    purpose). Where the speaker sends one message for several inputs
    (a partial code of a signalling game) the bonus favours, for each of those inputs, the
    messages the others send less often, which the game's reward alone does not.
    """
    if beta < 0 or not 0 <= conditional <= 1:
        raise ValueError(f"bad beta={beta!r} / conditional={conditional!r}; need beta >= 0 "
                         "and 0 <= conditional <= 1")
    m = batch.action_mask
    n = batch.n_rows
    if n == 0:
        return batch
    # each row's message, left-aligned and padded with -1: [n, longest message]
    width = max(int(m.sum(1).max()), 1)
    msg = torch.full((n, width), -1, dtype=torch.long, device=m.device)
    rows, cols = m.nonzero(as_tuple=True)
    msg[rows, (m.cumsum(1) - 1)[rows, cols]] = batch.input_ids[rows, cols].long()
    sent, n_sent = compact_ids(batch.env_id, batch.agent, *msg.T)
    scope, n_scope = compact_ids(batch.env_id, batch.agent)
    has = m.any(1)
    if seats is not None:
        has &= torch.isin(batch.agent, torch.as_tensor(list(seats), device=m.device))
    one = has.double()
    p = (segment_sum(one, sent, n_sent)[sent]
         / segment_sum(one, scope, n_scope)[scope].clamp(min=1))
    log_pi = (batch.old_logp.double() * m).sum(1)
    bonus = torch.where(has, conditional * log_pi - p.clamp(min=1e-30).log(), 0.0)
    return with_row_delta(batch, (beta * bonus).to(batch.reward.dtype))
