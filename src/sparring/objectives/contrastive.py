"""Contrastive (group / pairwise) objectives: copg, gvpo, pairwise_dpo.

They compare the sequences of a group, so they take ``group=Long[n]`` and
``rewards=Float[n]`` as options (one row = one sequence) and ignore ``advantages``.
Each computes a per-sequence loss L_i and puts it on every action token of row i:
aggregate with ``seq-mean-token-mean`` to get mean_i L_i. Sequence log-probs are sums
over the row's masked tokens. They have no importance ratio and return no diagnostics.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from sparring.objectives import objective
from sparring.objectives.common import check_same_shape, group_inputs, seq_sum
from sparring.segments import segment_count, segment_mean, segment_order


def _broadcast(per_seq: Tensor, mask: Tensor) -> Tensor:
    return per_seq[:, None] * mask


def _check_beta(name: str, beta: float) -> None:
    if not beta > 0:
        raise ValueError(f"{name}: beta must be > 0, got {beta!r}")


@objective("copg", family="contrastive", needs=("ref_logp", "group", "rewards"),
           source="Contrastive Policy Gradient: Aligning LLMs on sequence-level scores in "
           "a supervised-friendly fashion (CoPG), 2024")
def copg(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
         ref_logp: Tensor | None = None, group: Tensor | None = None,
         rewards: Tensor | None = None, beta: float = 0.1
         ) -> tuple[Tensor, dict[str, Tensor]]:
    """Pairwise contrastive policy gradient without importance sampling (our reading).

    For i, j in a group,
    l_ij = -sg(Rt_i - Rt_j) (log pi(y_i) - log pi(y_j)), Rt = R - beta log(pi/pi_ref)(y).
    Per sequence L_i = -c_i log pi(y_i), c_i = sg(Rt_i - mean_{j != i} Rt_j), so
    sum_i L_i = 1/(G-1) sum_{i<j} l_ij; groups of one give 0. Shapes: [n, T] -> [n, T]."""
    _check_beta("copg", beta)
    check_same_shape("copg", logp=logp, ref_logp=ref_logp, mask=mask)
    seg, n_seg, r = group_inputs("copg", logp.shape[0], group, rewards, logp.device)
    ell = seq_sum(logp, mask)
    rt = (r - beta * (ell - seq_sum(ref_logp, mask))).detach()
    G = segment_count(seg, n_seg, rt.dtype)[seg]
    c = torch.where(G > 1, (rt - segment_mean(rt, seg, n_seg)[seg]) * G / (G - 1).clamp(min=1),
                    torch.zeros_like(rt))
    return _broadcast(-c * ell, mask), {}


@objective("gvpo", family="contrastive", needs=("ref_logp", "group", "rewards"),
           source="GVPO: Group Variance Policy Optimization for Large Language Model "
           "Post-Training, 2025")
def gvpo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
         ref_logp: Tensor | None = None, group: Tensor | None = None,
         rewards: Tensor | None = None, beta: float = 0.1
         ) -> tuple[Tensor, dict[str, Tensor]]:
    """L_i = [(beta l_i - mean_g beta l) - (R_i - mean_g R)]^2, l_i = sum_t (logp - ref_logp)
    the sequence log-ratio to the reference (our reading; gradients flow through the
    group mean too). Shapes: [n, T] -> [n, T]."""
    _check_beta("gvpo", beta)
    check_same_shape("gvpo", logp=logp, ref_logp=ref_logp, mask=mask)
    seg, n_seg, r = group_inputs("gvpo", logp.shape[0], group, rewards, logp.device)
    ell = beta * seq_sum(logp - ref_logp, mask)
    d = (ell - segment_mean(ell, seg, n_seg)[seg]) - (r - segment_mean(r, seg, n_seg)[seg])
    return _broadcast(d ** 2, mask), {}


@objective("pairwise_dpo", family="contrastive", needs=("group", "rewards"),
           source="It Takes Two: Your GRPO Is Secretly DPO (2-GRPO); Direct Preference "
           "Optimization (2023)")
def pairwise_dpo(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
                 ref_logp: Tensor | None = None, group: Tensor | None = None,
                 rewards: Tensor | None = None, beta: float = 0.1
                 ) -> tuple[Tensor, dict[str, Tensor]]:
    """Winner-loser logistic loss on sequence log-ratios, over all pairs of a group.

    For every pair (w, l) of one group with R_w > R_l:
    l_wl = -log sigmoid(beta (h_w - h_l)), h = sum_t (logp - ref), ref = ``ref_logp`` or,
    when not given, ``old_logp`` (the 2-GRPO view). Each pair's loss is split equally
    between its two sequences (sum_i L_i = sum of pair losses); ties give nothing.
    Shapes: [n, T] -> [n, T]."""
    _check_beta("pairwise_dpo", beta)
    ref = old_logp if ref_logp is None else ref_logp
    check_same_shape("pairwise_dpo", logp=logp, ref=ref, mask=mask)
    n = logp.shape[0]
    seg, n_seg, r = group_inputs("pairwise_dpo", n, group, rewards, logp.device)
    h = beta * seq_sum(logp - ref, mask)
    _, rank, _, cnt = segment_order(torch.arange(n, device=logp.device), seg, n_seg)
    gmax = int(cnt.max()) if n else 1
    hp = h.new_zeros(n_seg, gmax).index_put((seg, rank), h)
    rp = r.new_full((n_seg, gmax), float("-inf")).index_put((seg, rank), r)
    valid = torch.zeros(n_seg, gmax, dtype=torch.bool, device=logp.device)
    valid[seg, rank] = True
    win = (rp[:, :, None] > rp[:, None, :]) & valid[:, :, None] & valid[:, None, :]
    pair = -F.logsigmoid(hp[:, :, None] - hp[:, None, :]) * win
    per = 0.5 * (pair.sum(2) + pair.sum(1))
    return _broadcast(per[seg, rank], mask), {}
