"""Critic-based estimators: multi-turn token GAE, bi-level (turn, token) GAE, ArCHer targets.

GAE is the backward recurrence over an agent's action tokens
``A_t = r_t + gamma V_{t'} - V_t + gamma lam A_{t'}``, t' the agent's next action token.
`token_gae` computes it as a reverse loop over the token axis, vectorised over rows; it
skips observation, prompt and padding tokens by carrying the next action token's value
and advantage across them. In turn layout each of an agent's turns is a row: `gae` runs
over the agent's turns in the (trajectory, turn) grid, last turn first, and starts each
turn's rows from the carry that the agent's next turn left.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparring.advantages import estimator
from sparring.advantages.common import keep_rows, to_tokens, turn_rewards
from sparring.advantages.common import whiten as whiten_values
from sparring.advantages.scan import from_grid, reverse_discounted_sum, to_grid
from sparring.data import TurnBatch


def _values(batch: TurnBatch, name: str) -> Tensor:
    if batch.values is None:
        raise ValueError(f"{name} needs critic values: batch.values [n_rows, T] is None")
    if batch.values.shape != batch.action_mask.shape:
        raise ValueError(f"batch.values has shape {tuple(batch.values.shape)}, "
                         f"action_mask has {tuple(batch.action_mask.shape)}")
    return batch.values.float()


def last_action(mask: Tensor) -> Tensor:
    """Bool ``[n, T]``: each row's last action token (no action token after it)."""
    return mask & (mask.flip(1).cumsum(1).flip(1) == 1)


def token_gae(V: Tensor, mask: Tensor, r: Tensor, gamma: float, lam: float,
              next_v: Tensor | None = None, next_a: Tensor | None = None
              ) -> tuple[Tensor, Tensor, Tensor]:
    """GAE over the action tokens of rows ``[m, T]``: one reverse pass over the token axis.

    ``A_t = r_t + gamma V_{t'} - V_t + gamma lam A_{t'}`` on action tokens (``mask``), t' the
    row's next action token; after the row's last one, ``(V_{t'}, A_{t'}) = (next_v,
    next_a)`` ``[m]`` (0 by default). ``r [m, T]`` is read on action tokens only. Returns
    A ``[m, T]`` (0 off the mask) and (V, A) at each row's first action token, the carry
    for the turn before it (``next_v``, ``next_a`` for rows without action tokens).
    """
    m = mask.shape[0]
    next_v = V.new_zeros(m) if next_v is None else next_v
    next_a = V.new_zeros(m) if next_a is None else next_a
    A = torch.zeros_like(V)
    action_columns = mask.any(0).nonzero().flatten().tolist()  # other columns: carry unchanged
    for t in reversed(action_columns):
        a = r[:, t] + gamma * next_v - V[:, t] + gamma * lam * next_a
        on = mask[:, t]
        A[:, t] = torch.where(on, a, 0.0)
        next_a = torch.where(on, a, next_a)
        next_v = torch.where(on, V[:, t], next_v)
    return A, next_v, next_a


def _kept(A: Tensor, batch: TurnBatch, keep: Tensor, whiten: bool) -> Tensor:
    """A on the kept rows' action tokens, 0 elsewhere; ``whiten``: ``(A - mean) / (std +
    1e-8)`` over those tokens (std unbiased; 0 when they are all equal)."""
    m = batch.action_mask & keep[:, None]
    A = torch.where(m, A, 0.0)
    if whiten:
        A[m] = whiten_values(A[m].double(), 1e-8).float()
    return A


@estimator("gae", family="critic", needs=("values", "reward"), layout="any",
           source="GAE (Schulman et al. 2016); multi-turn masking as in RAGEN/verl-agent",
           keep=keep_rows)
def gae(batch: TurnBatch, *, gamma: float = 1.0, lam: float = 0.95, whiten: bool = False,
        token_rewards: Tensor | None = None, add_return: bool = False,
        truncated: str = "mask") -> Tensor:
    """Token-level GAE over an agent's action tokens, across its own turns.

    ``delta_t = r_t + gamma V_{t'} - V_t`` and ``A_t = delta_t + gamma lam A_{t'}``, t' the
    agent's next action token (in the same turn or the first of its next turn; none after its
    last turn: V_{t'} = A_{t'} = 0). Observation tokens are skipped. r_t: the turn's reward
    on its last action token, plus ``token_rewards [n, T]`` (e.g. a per-token KL penalty).
    ``whiten``: normalise A to zero mean, unit std over the kept action tokens.
    Trajectory layout: the row's reward sits on its last action token.
    Shapes: values ``[n, T]`` -> ``[n, T]``. Source: GAE (2016).
    """
    keep = keep_rows(batch, truncated)
    V, mask = _values(batch, "gae"), batch.action_mask
    r = torch.where(last_action(mask), turn_rewards(batch, add_return)[:, None], 0.0)
    if token_rewards is not None:
        if token_rewards.shape != mask.shape:
            raise ValueError(f"token_rewards has shape {tuple(token_rewards.shape)}, "
                             f"expected {tuple(mask.shape)}")
        r = r + torch.where(mask, token_rewards.float(), 0.0)
    rows = to_grid(torch.arange(batch.n_rows, device=batch.device), batch, fill=-1)
    next_v, next_a = V.new_zeros(batch.n_traj), V.new_zeros(batch.n_traj)
    A = torch.zeros_like(V)
    for k in reversed(range(rows.shape[1])):  # the agents' turns, last first
        has = rows[:, k] >= 0
        i = rows[has, k]
        A[i], next_v[has], next_a[has] = token_gae(V[i], mask[i], r[i], gamma, lam,
                                                   next_v[has], next_a[has])
    return _kept(A, batch, keep, whiten)


@estimator("turn_gae", family="critic", needs=("values", "turn", "reward"), layout="turn",
           source="RAGEN bi-level GAE (2025)", keep=keep_rows)
def turn_gae(batch: TurnBatch, *, gamma: float = 1.0, lam: float = 0.95,
             high_gamma: float = 0.95, high_lam: float | None = None, whiten: bool = False,
             add_return: bool = False, truncated: str = "mask") -> Tensor:
    """Bi-level GAE: over turns with turn-end values, then within each turn.

    Turn level (per agent): ``V^e_k`` = value at turn k's last action token,
    ``delta_k = r_k + high_gamma V^e_{k+1} - V^e_k`` (V^e after the last turn: 0),
    ``A^hi_k = sum_{j >= k} (high_gamma high_lam)^(j-k) delta_j``, target
    ``y_k = A^hi_k + V^e_k``. Token level: GAE(gamma, lam) inside turn k with reward ``y_k``
    on its last action token and no bootstrap past it (so the last token's advantage is
    ``A^hi_k``). ``high_lam`` defaults to ``lam``. ``whiten`` as in `gae`.
    Shapes: ``[n, T]``. Source: RAGEN (2025), bi-level GAE; our reading of its description.
    """
    keep = keep_rows(batch, truncated)
    V, mask = _values(batch, "turn_gae"), batch.action_mask
    last = last_action(mask)
    v_end = torch.where(last, V, 0.0).sum(1)  # [n_rows]
    ve = to_grid(v_end, batch)  # [n_traj, K]
    ve_next = torch.cat([ve[:, 1:], torch.zeros_like(ve[:, :1])], 1)
    delta = to_grid(turn_rewards(batch, add_return), batch) + high_gamma * ve_next - ve
    hl = lam if high_lam is None else high_lam
    y = from_grid(reverse_discounted_sum(delta, high_gamma * hl), batch) + v_end
    A, _, _ = token_gae(V, mask, torch.where(last, y[:, None], 0.0), gamma, lam)
    return _kept(A, batch, keep, whiten)


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
    vt_next = torch.cat([vt[:, 1:], torch.zeros_like(vt[:, :1])], 1)  # 0 after the last turn
    q = archer_q_target(batch.reward.float(), batch.last, from_grid(vt_next, batch), gamma)
    valid = keep_rows(batch, truncated) | ~batch.last
    return q, valid


@estimator("archer_targets", family="critic", needs=("utterance_critic",), layout="turn",
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
    return to_tokens(batch, torch.where(keep, adv.float(), 0.0))
