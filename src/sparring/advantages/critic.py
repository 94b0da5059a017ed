"""Critic-based estimators: multi-turn token GAE, bi-level (turn, token) GAE, ArCHer targets.

GAE inside a row (over its action tokens only; observations, prompts and padding are
skipped) is a discounted suffix scan without a loop over tokens: `token_scan.token_gae`
(blocked chunk matmuls; rows with non-contiguous action tokens are compacted first).
Bootstrapping across an agent's own turns (turn layout: each turn is a row) is exact and
loop-free: the within-row pass gives each row's advantage with a zero tail; the tail
correction ``c_k`` obeys the backward recurrence ``c_k = gamma V_{k+1,first} + gamma lam
A^loc_{k+1,first} + (gamma lam)^{len_{k+1}} c_{k+1}`` over turns, solved with
`scan.reverse_scan`, and each action token t gets ``A_t = A^loc_t + (gamma lam)^{d_t} c_k``
(d_t = action tokens after t in its row).
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparring.advantages import estimator
from sparring.advantages.rowblock import keep_where, masked_row_sum, row_blocks, row_count
from sparring.advantages.scan import from_grid, reverse_scan, to_grid, to_tokens
from sparring.advantages.token_scan import last_index, spans, token_gae
from sparring.advantages.turn import keep_rows, turn_rewards
from sparring.data import TurnBatch


def _values(batch: TurnBatch, name: str) -> Tensor:
    if batch.values is None:
        raise ValueError(f"{name} needs critic values: batch.values [n_rows, T] is None")
    if batch.values.shape != batch.action_mask.shape:
        raise ValueError(f"batch.values has shape {tuple(batch.values.shape)}, "
                         f"action_mask has {tuple(batch.action_mask.shape)}")
    return batch.values.float()


def _check_token_rewards(token_rewards: Tensor | None, mask: Tensor) -> Tensor | None:
    if token_rewards is not None and token_rewards.shape != mask.shape:
        raise ValueError(f"token_rewards has shape {tuple(token_rewards.shape)}, "
                         f"expected {tuple(mask.shape)}")
    return token_rewards


def _whiten(A: Tensor, m: Tensor, min_count: int) -> Tensor:
    """In place: ``(A - mean) / (std + 1e-8)`` over ``m`` (A is zero outside m), when m has
    at least ``min_count`` entries; std unbiased, 0 for a single entry."""
    cnt = int(row_count(m).sum())
    if cnt < min_count:
        return A
    mu = A.sum(dtype=torch.float64) / cnt
    sd = (masked_row_sum((A - mu.to(A.dtype)) ** 2, m).sum(dtype=torch.float64) / (cnt - 1)
          ).sqrt() if cnt > 1 else torch.zeros((), dtype=torch.float64)
    mu_, den = mu.to(A.dtype), (sd + 1e-8).to(A.dtype)
    for b in row_blocks(*A.shape):
        keep_where(m[b], (A[b] - mu_) / den, out=A[b])
    return A


def _gae(batch: TurnBatch, gamma: float, lam: float, token_rewards: Tensor | None,
         add_return: bool, keep: Tensor | None) -> Tensor:
    V = _values(batch, "gae")
    mask = batch.action_mask
    tr = _check_token_rewards(token_rewards, mask)
    gl = gamma * lam
    bootstrap = None
    if batch.layout == "turn" and batch.n_rows and int(batch.turn.max()) > 0:
        def bootstrap(first_a: Tensor, first_v: Tensor) -> Tensor:
            fa, fv = to_grid(first_a, batch), to_grid(first_v, batch)
            ln = to_grid(row_count(mask, V.dtype), batch)
            a = torch.zeros_like(fa)
            b = torch.zeros_like(fa)
            a[:, :-1] = gamma * fv[:, 1:] + gl * fa[:, 1:]
            b[:, :-1] = torch.pow(torch.tensor(gl, dtype=V.dtype), ln[:, 1:])
            return from_grid(reverse_scan(a, b), batch)
    A, _, _ = token_gae(V, mask, turn_rewards(batch, add_return), gamma, lam,
                        token_rewards=tr, keep=keep, bootstrap=bootstrap)
    return A


def gae_advantages(batch: TurnBatch, *, gamma: float = 1.0, lam: float = 0.95,
                   token_rewards: Tensor | None = None, add_return: bool = False
                   ) -> tuple[Tensor, Tensor]:
    """(advantages, returns) ``[n_rows, T]`` of multi-turn token GAE (see the module doc)."""
    A = _gae(batch, gamma, lam, token_rewards, add_return, None)
    return A, keep_where(batch.action_mask, A + _values(batch, "gae"))


@estimator("gae", family="critic", needs=("values", "reward"), layout="any",
           source="GAE (Schulman et al. 2016); multi-turn masking as in RAGEN/verl-agent",
           keep=keep_rows)
def gae(batch: TurnBatch, *, gamma: float = 1.0, lam: float = 0.95, whiten: bool = False,
        token_rewards: Tensor | None = None, add_return: bool = False,
        truncated: str = "mask") -> Tensor:
    """Token-level GAE over an agent's action tokens, across its own turns.

    ``delta_t = r_t + gamma V_{t'} - V_t`` and ``A_t = delta_t + gamma lam A_{t'}``, t' the
    agent's next action token (in the same turn or the first of its next turn; none after its
    last turn). Observation tokens are skipped. r_t: the turn's reward on its last action
    token, plus ``token_rewards [n, T]`` (e.g. a per-token KL penalty). ``whiten``: normalise
    A to zero mean, unit std over the kept action tokens. Shapes: values ``[n, T]`` -> ``[n, T]``.
    Source: GAE (2016). Trajectory layout: the row's reward sits on its last action token.
    Algorithm: blocked suffix scan (`token_scan`), no loop over tokens, rows or turns.
    """
    keep = keep_rows(batch, truncated)
    A = _gae(batch, gamma, lam, token_rewards, add_return, keep)
    if whiten:
        A = _whiten(A, batch.action_mask & keep[:, None], 1)
    return A


def _bilevel(batch: TurnBatch, gamma: float, lam: float, high_gamma: float,
             high_lam: float | None, add_return: bool, keep: Tensor | None) -> Tensor:
    V = _values(batch, "turn_gae")
    mask = batch.action_mask
    hl = lam if high_lam is None else high_lam
    sp = spans(mask)
    last = sp[1] if sp[3] else last_index(mask)
    v_end = torch.where(sp[2] > 0, V.gather(1, last[:, None]).squeeze(1), 0.0)
    ve = to_grid(v_end, batch)
    nxt = torch.zeros_like(ve)
    nxt[:, :-1] = ve[:, 1:]
    delta = to_grid(turn_rewards(batch, add_return), batch) + high_gamma * nxt - ve
    a_hi = from_grid(reverse_scan(delta, high_gamma * hl), batch)
    return token_gae(V, mask, a_hi + v_end, gamma, lam, keep=keep, spans_=sp)[0]


def bilevel_gae(batch: TurnBatch, *, gamma: float = 1.0, lam: float = 0.95,
                high_gamma: float = 0.95, high_lam: float | None = None,
                add_return: bool = False) -> tuple[Tensor, Tensor]:
    """(advantages, returns) ``[n_rows, T]`` of bi-level GAE (see `turn_gae`)."""
    A = _bilevel(batch, gamma, lam, high_gamma, high_lam, add_return, None)
    return A, keep_where(batch.action_mask, A + _values(batch, "turn_gae"))


@estimator("turn_gae", family="critic", needs=("values", "turn", "reward"), layout="turn",
           source="RAGEN bi-level GAE (2025)", keep=keep_rows)
def turn_gae(batch: TurnBatch, *, gamma: float = 1.0, lam: float = 0.95,
             high_gamma: float = 0.95, high_lam: float | None = None, whiten: bool = False,
             add_return: bool = False, truncated: str = "mask") -> Tensor:
    """Bi-level GAE: over turns with turn-end values, then within each turn.

    Turn level (per agent): ``V^e_k`` = value at turn k's last action token,
    ``delta_k = r_k + high_gamma V^e_{k+1} - V^e_k``, ``A^hi_k = sum_j (high_gamma
    high_lam)^(j-k) delta_j``, target ``y_k = A^hi_k + V^e_k``. Token level: GAE(gamma, lam)
    inside turn k with reward ``y_k`` on its last action token and no bootstrap past it (so
    the last token's advantage is ``A^hi_k``). ``high_lam`` defaults to ``lam``.
    Shapes: ``[n, T]``. Source: RAGEN (2025), bi-level GAE; our reading of its description.
    Algorithm: turn level by `scan.reverse_scan`, token level by `token_scan.token_gae`.
    """
    keep = keep_rows(batch, truncated)
    A = _bilevel(batch, gamma, lam, high_gamma, high_lam, add_return, keep)
    if whiten:
        A = _whiten(A, batch.action_mask & keep[:, None], 2)
    return A


def archer_q_target(reward: Tensor, done: Tensor, v_target_next: Tensor,
                    gamma: float = 0.99) -> Tensor:
    """ArCHer utterance-level TD target ``Q(s, a) <- r + gamma (1 - done) V_target(s')``."""
    return reward + gamma * (1.0 - done.float()) * v_target_next


def archer_v_target(q1_target: Tensor, q2_target: Tensor) -> Tensor:
    """ArCHer value target ``V(s) <- min(Q1_target, Q2_target)(s, a ~ pi)``."""
    return torch.minimum(q1_target, q2_target)


def archer_td_targets(batch: TurnBatch, *, v_target: str = "v_target", gamma: float = 0.99,
                      truncated: str = "mask") -> tuple[Tensor, Tensor]:
    """Per-turn Q targets ``[n]`` and which rows have a valid target ``Bool[n]``.

    s' is the agent's state at its next turn (extra ``v_target`` there holds V_target(s'));
    the agent's last turn is terminal, unless the episode was truncated: then it has no
    target under ``truncated="mask"`` (the bootstrap value is unknown).
    """
    if v_target not in batch.extras:
        raise ValueError(f"archer_td_targets needs the per-turn extra {v_target!r}")
    vt = to_grid(torch.nan_to_num(batch.extras[v_target].float()), batch)
    nxt = torch.zeros_like(vt)
    nxt[:, :-1] = vt[:, 1:]
    q = archer_q_target(batch.reward.float(), batch.last, from_grid(nxt, batch), gamma)
    valid = keep_rows(batch, truncated) | ~batch.last
    return q, valid


@estimator("archer_targets", family="critic", needs=("extras:q1,q2,v1,v2",), layout="turn",
           source="ArCHer (hierarchical multi-turn RL), 2024", keep=keep_rows)
def archer_targets(batch: TurnBatch, *, q1: str = "q1", q2: str = "q2", v1: str = "v1",
                   v2: str = "v2", truncated: str = "mask") -> Tensor:
    """Token-policy advantage from ArCHer's utterance critic: ``A = min(Q1,Q2) - min(V1,V2)``.

    Q1/Q2 (s, a) and V1/V2 (s) are the twin critic heads' per-turn outputs (extras), broadcast
    to the turn's action tokens. Targets for training the heads: `archer_td_targets`,
    `archer_v_target`. Shapes: ``[n_rows, T]``. Source: ArCHer (2024).
    """
    for k in (q1, q2, v1, v2):
        if k not in batch.extras:
            raise ValueError(f"archer_targets needs the per-turn extra {k!r} (critic output)")
    ex = batch.extras
    adv = torch.minimum(ex[q1], ex[q2]) - torch.minimum(ex[v1], ex[v2])
    keep = keep_rows(batch, truncated)
    return to_tokens(torch.where(keep, adv.float(), 0.0), batch)
