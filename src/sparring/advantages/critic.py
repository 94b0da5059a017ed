"""Critic-based estimators: multi-turn token GAE, bi-level (turn, token) GAE, ArCHer targets.

GAE computation: a backward loop over the token axis T (the standard exception), vectorised
across all rows, skipping non-action tokens (observations, prompts, padding carry the next
action token's value and advantage through unchanged). Bootstrapping across an agent's own
turns (turn layout: each turn is a row) is exact and loop-free: the within-row pass gives
each row's advantage with a zero tail; the tail correction ``c_k`` obeys the backward
recurrence ``c_k = gamma V_{k+1,first} + gamma lam A^loc_{k+1,first} + (gamma lam)^{len_{k+1}}
c_{k+1}`` over turns, solved with `scan.reverse_scan`, and each action token t gets
``A_t = A^loc_t + (gamma lam)^{d_t} c_k`` (d_t = action tokens after t in its row).
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparring.advantages import estimator
from sparring.advantages.scan import from_grid, reverse_scan, to_grid, to_tokens
from sparring.advantages.turn import keep_rows, turn_rewards
from sparring.data import TurnBatch


def _values(batch: TurnBatch, name: str) -> Tensor:
    if batch.values is None:
        raise ValueError(f"{name} needs critic values: batch.values [n_rows, T] is None")
    if batch.values.shape != batch.action_mask.shape:
        raise ValueError(f"batch.values has shape {tuple(batch.values.shape)}, "
                         f"action_mask has {tuple(batch.action_mask.shape)}")
    return batch.values.float()


def last_action_onehot(mask: Tensor) -> Tensor:
    """``Bool[n, T]``: the last action token of each row."""
    after = mask.flip(1).cumsum(1).flip(1)  # action tokens at or after t
    return mask & (after == 1)


def row_gae(r: Tensor, V: Tensor, mask: Tensor, gamma: float, lam: float
            ) -> tuple[Tensor, Tensor, Tensor]:
    """GAE inside each row over its action tokens only, with zero value after the row.

    ``delta_t = r_t + gamma V_next(t) - V_t``, ``A_t = delta_t + gamma lam A_next(t)``, where
    next(t) is the row's next *action* token. Returns (A ``[n, T]``, A and V at each row's
    first action token ``[n]``). Loop over T, vectorised across rows.
    """
    n, T = mask.shape
    rv = (r - V).t().contiguous()  # r_t - V_t, [T, n]
    VT, mT = V.t().contiguous(), mask.t().contiguous()
    out = torch.empty_like(rv)
    carry_a = torch.zeros(n, dtype=r.dtype, device=r.device)
    carry_v = torch.zeros_like(carry_a)
    gl = gamma * lam
    for t in range(T - 1, -1, -1):
        a = torch.add(rv[t], carry_v, alpha=gamma).add_(carry_a, alpha=gl)
        out[t] = a
        carry_a = torch.where(mT[t], a, carry_a)
        carry_v = torch.where(mT[t], VT[t], carry_v)
    out = torch.where(mask, out.t(), 0.0)
    return out, carry_a, carry_v


def _token_rewards(batch: TurnBatch, token_rewards: Tensor | None, add_return: bool) -> Tensor:
    mask = batch.action_mask
    r = last_action_onehot(mask) * turn_rewards(batch, add_return)[:, None]
    if token_rewards is not None:
        if token_rewards.shape != mask.shape:
            raise ValueError(f"token_rewards has shape {tuple(token_rewards.shape)}, "
                             f"expected {tuple(mask.shape)}")
        r = r + token_rewards.float() * mask
    return r


def gae_advantages(batch: TurnBatch, *, gamma: float = 1.0, lam: float = 0.95,
                   token_rewards: Tensor | None = None, add_return: bool = False
                   ) -> tuple[Tensor, Tensor]:
    """(advantages, returns) ``[n_rows, T]`` of multi-turn token GAE (see the module doc)."""
    V = _values(batch, "gae")
    mask = batch.action_mask
    r = _token_rewards(batch, token_rewards, add_return)
    A, first_a, first_v = row_gae(r, V, mask, gamma, lam)
    if batch.layout == "turn" and batch.n_rows and int(batch.turn.max()) > 0:
        gl = gamma * lam
        fa, fv = to_grid(first_a, batch), to_grid(first_v, batch)
        ln = to_grid(batch.length.to(r.dtype), batch)
        a = torch.zeros_like(fa)
        b = torch.zeros_like(fa)
        a[:, :-1] = gamma * fv[:, 1:] + gl * fa[:, 1:]
        b[:, :-1] = torch.pow(torch.tensor(gl, dtype=r.dtype), ln[:, 1:])
        c = from_grid(reverse_scan(a, b), batch)
        d = (batch.length[:, None] - mask.cumsum(1)).to(r.dtype)  # action tokens after t
        A = A + torch.where(mask, torch.pow(torch.tensor(gl, dtype=r.dtype), d) * c[:, None], 0.0)
    return A, (A + V) * mask


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
    """
    keep = keep_rows(batch, truncated)
    A, _ = gae_advantages(batch, gamma=gamma, lam=lam, token_rewards=token_rewards,
                          add_return=add_return)
    m = batch.action_mask & keep[:, None]
    if whiten and bool(m.any()):
        mu = A[m].mean()
        sd = A[m].std() if int(m.sum()) > 1 else torch.zeros(())
        A = (A - mu) / (sd + 1e-8)
    return torch.where(m, A, 0.0)


def bilevel_gae(batch: TurnBatch, *, gamma: float = 1.0, lam: float = 0.95,
                high_gamma: float = 0.95, high_lam: float | None = None,
                add_return: bool = False) -> tuple[Tensor, Tensor]:
    """(advantages, returns) ``[n_rows, T]`` of bi-level GAE (see `turn_gae`)."""
    V = _values(batch, "turn_gae")
    mask = batch.action_mask
    hl = lam if high_lam is None else high_lam
    last = last_action_onehot(mask)
    v_end = (V * last).sum(1)
    ve = to_grid(v_end, batch)
    nxt = torch.zeros_like(ve)
    nxt[:, :-1] = ve[:, 1:]
    delta = to_grid(turn_rewards(batch, add_return), batch) + high_gamma * nxt - ve
    a_hi = from_grid(reverse_scan(delta, high_gamma * hl), batch)
    target = a_hi + v_end
    A, _, _ = row_gae(last * target[:, None], V, mask, gamma, lam)
    return A, (A + V) * mask


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
    """
    keep = keep_rows(batch, truncated)
    A, _ = bilevel_gae(batch, gamma=gamma, lam=lam, high_gamma=high_gamma, high_lam=high_lam,
                       add_return=add_return)
    m = batch.action_mask & keep[:, None]
    if whiten and int(m.sum()) > 1:
        A = (A - A[m].mean()) / (A[m].std() + 1e-8)
    return torch.where(m, A, 0.0)


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
