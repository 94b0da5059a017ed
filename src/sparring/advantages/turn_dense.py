"""Dense turn rewards: information gain (IGPO) and tool-call matching (MatchTIR).

Per-turn inputs arrive as named extras (``Turn.extras`` -> ``batch.extras[name]``):

* IGPO: ``p_before`` / ``p_after`` -- the policy's probability of the ground-truth answer
  before and after the turn (computed by the rollout; names configurable).
* MatchTIR: ``match`` -- the turn's matching reward, produced per episode by
  `match_turn_rewards` (linear-sum assignment between predicted and reference tool calls)
  and stored in ``Turn.extras["match"]`` before collation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from sparring.advantages import estimator
from sparring.advantages.common import check_choice, keep_rows, to_tokens
from sparring.advantages.normalize import normalize, scope_ids
from sparring.advantages.scan import rtg
from sparring.data import TurnBatch


def _extra(batch: TurnBatch, name: str, estimator_name: str) -> Tensor:
    if name not in batch.extras:
        raise ValueError(f"{estimator_name} needs the per-turn extra {name!r} "
                         f"(Turn.extras); the batch has {sorted(batch.extras) or 'none'}")
    return batch.extras[name].float()


@estimator("igpo", family="turn", needs=("group", "turn", "extras:p_before,p_after", "returns"),
           layout="turn", source="Information Gain-based Policy Optimization (IGPO), 2025",
           keep=keep_rows)
def igpo(batch: TurnBatch, *, before: str = "p_before", after: str = "p_after",
         discount: float = 1.0, scope: str = "group", std: bool = True, eps: float = 1e-6,
         truncated: str = "mask") -> Tensor:
    """Information-gain turn rewards combined with the outcome, then group-relative.

    ``r_k = p_after_k - p_before_k`` for the agent's non-final turns and ``r_K = R`` (the
    outcome, ``returns``) for its final turn; all rewards of scope s (default: the group)
    are normalised jointly, ``r~ = (r - mean_s r) / (std_s r + eps)``, and the advantage is
    the discounted return-to-go ``A_k = sum_{j >= k} discount^(j-k) r~_j`` over own turns.
    Missing extras (NaN) count as zero gain. Shapes: ``[n_rows, T]``.
    Source: IGPO (2025); the normalisation and combination are our reading of the abstract.
    """
    keep = keep_rows(batch, truncated)
    gain = torch.nan_to_num(_extra(batch, after, "igpo") - _extra(batch, before, "igpo"))
    r = torch.where(batch.last, batch.returns.float(), gain)
    ids, n = scope_ids(batch, scope)
    r = torch.where(keep, normalize(r, ids, n, std=std, eps=eps, include=keep), 0.0)
    return to_tokens(batch, torch.where(keep, rtg(batch, r, discount), 0.0))


STRATEGIES = ("hard", "soft")


def match_turn_rewards(sim: np.ndarray | Sequence[Sequence[float]], pred_turn: Sequence[int],
                       n_turns: int, *, strategy: str = "hard",
                       threshold: float = 0.5) -> list[float]:
    """One episode's turn rewards from predicted-vs-reference tool-call matching.

    ``sim [n_pred, n_ref]``: similarity in [0, 1] of each predicted call to each reference
    call; ``pred_turn[p]``: the turn (0..n_turns-1) that made prediction p. A maximum-weight
    bipartite matching (``scipy.optimize.linear_sum_assignment``) pairs predictions with
    references; a prediction scores ``1[sim >= threshold]`` (``hard``) or ``sim`` (``soft``)
    when matched, 0 when not. A turn's reward is the mean score of its predictions (0 when it
    made none). Source: MatchTIR (2026); scoring details are our reading.
    """
    from scipy.optimize import linear_sum_assignment

    check_choice("strategy", strategy, STRATEGIES)
    s = np.asarray(sim, dtype=np.float64).reshape(len(pred_turn), -1)
    score = np.zeros(len(pred_turn))
    if s.size:
        rows, cols = linear_sum_assignment(s, maximize=True)
        val = s[rows, cols]
        score[rows] = (val >= threshold).astype(np.float64) if strategy == "hard" else val
    pt = np.asarray(pred_turn, dtype=np.int64)
    if pt.size and (pt.min() < 0 or pt.max() >= n_turns):
        raise ValueError(f"pred_turn must lie in 0..{n_turns - 1}, got {pt.tolist()}")
    tot = np.bincount(pt, weights=score, minlength=n_turns)
    cnt = np.bincount(pt, minlength=n_turns)
    return (tot / np.maximum(cnt, 1)).tolist()


@estimator("matchtir", family="turn", needs=("group", "turn", "extras:match", "returns"),
           layout="turn", source="MatchTIR (bipartite-matching turn rewards), 2026",
           keep=keep_rows)
def matchtir(batch: TurnBatch, *, reward: str = "match", turn_weight: float = 0.5,
             discount: float = 1.0, scope: str = "group_agent", std: bool = True,
             eps: float = 1e-6, truncated: str = "mask") -> Tensor:
    """Dual-level advantage: ``A = w * A_turn + (1 - w) * A_traj``.

    ``A_turn = norm_s(G)``, G the discounted return-to-go of the matching rewards (extra
    ``reward``) over the agent's own turns, normalised over all turns of scope s;
    ``A_traj = norm_s(R)`` over the trajectories' outcomes (one value per trajectory);
    ``norm_s(x) = (x - mean_s x) / (std_s x + eps)``. Shapes: ``[n_rows, T]``.
    Source: MatchTIR (2026); the weighting is our reading of the abstract.
    """
    if not 0.0 <= turn_weight <= 1.0:
        raise ValueError(f"bad turn_weight={turn_weight!r}; must be in [0, 1]")
    keep = keep_rows(batch, truncated)
    ids, n = scope_ids(batch, scope)
    G = rtg(batch, torch.nan_to_num(_extra(batch, reward, "matchtir")), discount)
    a_turn = normalize(G, ids, n, std=std, eps=eps, include=keep)
    a_traj = normalize(batch.returns.float(), ids, n, std=std, eps=eps, include=keep & batch.last)
    adv = turn_weight * a_turn + (1.0 - turn_weight) * a_traj
    return to_tokens(batch, torch.where(keep, adv, 0.0))
