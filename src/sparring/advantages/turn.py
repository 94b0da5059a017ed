"""Turn-level and multi-agent credit assignment (turn layout: one row per turn).

Common options:

* ``truncated``: ``"mask"`` (default) gives rows of episodes stopped by a turn budget a
  zero advantage, leaves them out of every statistic, and drops them from the loss (the
  estimators' ``keep``); ``"terminal"`` treats the truncation as a normal episode end.
* ``add_return``: also credit ``batch.returns`` (the agent's final return) to the agent's
  last turn, for environments that put the outcome in the returns and not in a turn reward.

Return-to-go over an agent's own turns is `scan.rtg` (a reverse loop over the dense
(trajectory, turn) grid); statistics are segment ops over rows.
"""

from __future__ import annotations

import difflib

import torch
from torch import Tensor

from sparring.advantages import estimator
from sparring.advantages.common import check_choice, keep_rows, to_tokens, turn_rewards
from sparring.advantages.normalize import ema_update, loo_baseline, normalize, scope_ids
from sparring.advantages.scan import rtg
from sparring.data import TurnBatch
from sparring.segments import compact_ids, segment_first, segment_sum


@estimator("turn_rtg", family="turn", needs=("group", "agent", "turn", "reward"), layout="turn",
           source="MARS (Multi-Agent Reasoning through Self-play), 2025", keep=keep_rows)
def turn_rtg(batch: TurnBatch, *, discount: float = 1.0, scope: str = "group_agent",
             std: bool = True, eps: float = 1e-6, add_return: bool = False,
             truncated: str = "mask") -> Tensor:
    """MARS turn-level advantage with agent-specific normalisation.

    ``G_k = sum_{j >= k, j the same agent's turns} discount^(j-k) r_j`` (each turn's reward is
    credited to the acting agent), then ``A_k = (G_k - mean_s G) / (std_s G + eps)`` over the
    turns of scope s (default (group, agent): seats are never compared with each other, so
    zero-sum seats do not cancel); mean-only with ``std=False``.
    Shapes: returns ``[n_rows, T]`` on action tokens. Source: MARS (2025); the formula is our
    reading of the abstract and the public code (gamma = 1, per-player normalisation).
    """
    keep = keep_rows(batch, truncated)
    G = rtg(batch, turn_rewards(batch, add_return), discount)
    ids, n = scope_ids(batch, scope)
    adv = normalize(G, ids, n, std=std, eps=eps, include=keep)
    return to_tokens(batch, torch.where(keep, adv, 0.0))


@estimator("trloo", family="turn", needs=("group", "agent", "turn", "reward"), layout="turn",
           source="Dr. Kernel (TRLOO), 2025", keep=keep_rows)
def trloo(batch: TurnBatch, *, discount: float = 1.0, scope: str = "group_agent_turn",
          loo: bool = True, alone: float = 0.0, add_return: bool = False,
          truncated: str = "mask") -> Tensor:
    """Turn-level REINFORCE leave-one-out.

    ``A_{i,k} = G_{i,k} - 1/(|S_k| - 1) sum_{j in S_k, j != i} G_{j,k}`` where S_k are the rows of
    the same scope (default: same group, agent and turn index k) and G the return-to-go over
    the agent's own turns. The baseline never contains the sample itself, so it cannot depend
    on the sample's action -- also when the policy controls how many episodes reach turn k.
    A row with no other member gets baseline ``alone`` (0: plain REINFORCE, still unbiased).
    ``loo=False`` is the self-inclusive per-turn-index mean (GRPO per turn), which is biased
    (see tests/test_turn_estimators.py::test_per_turn_baseline_bias_enumerated).
    Shapes: ``[n_rows, T]``. Source: Dr. Kernel (2025); our reading of the abstract.
    """
    keep = keep_rows(batch, truncated)
    G = rtg(batch, turn_rewards(batch, add_return), discount)
    ids, n = scope_ids(batch, scope)
    if loo:
        adv = G - loo_baseline(G, ids, n, include=keep, alone=alone)
    else:
        adv = normalize(G, ids, n, std=False, include=keep)
    return to_tokens(batch, torch.where(keep, adv, 0.0))


def _state_clusters(keys: list[str], scope: Tensor, state: Tensor, threshold: float) -> Tensor:
    """Per row, a cluster id for its state within its scope (-1 for an unknown state).

    Within each scope, states are taken in the order of ``keys`` (first appearance); a
    state joins the first earlier cluster of the same scope whose representative (its
    first state) has ``difflib`` ratio >= ``threshold``, else it starts a new cluster.
    Loops over distinct (scope, state) pairs, not rows.
    """
    pairs, inverse = torch.unique(torch.stack([scope, state], 1), dim=0, return_inverse=True)
    representatives: dict[int, list[tuple[str, int]]] = {}
    cluster: list[int] = []
    for s, k in pairs.tolist():
        if k < 0:
            cluster.append(-1)
            continue
        mine = representatives.setdefault(s, [])
        c = next((c for rep, c in mine
                  if difflib.SequenceMatcher(None, keys[k], rep).ratio() >= threshold), None)
        if c is None:
            c = len(cluster)
            mine.append((keys[k], c))
        cluster.append(c)
    return torch.tensor(cluster, dtype=torch.long, device=state.device)[inverse]


@estimator("gigpo", family="turn", needs=("group", "state_key", "reward", "returns"),
           layout="turn", source="Group-in-Group Policy Optimization (GiGPO), 2025",
           keep=keep_rows)
def gigpo(batch: TurnBatch, *, omega: float = 1.0, discount: float = 0.95, std: bool = True,
          eps: float = 1e-6, scope: str = "group_agent", similarity: float = 1.0,
          anchors: str = "group", truncated: str = "mask") -> Tensor:
    """GiGPO: episode-level plus anchor-state step-level relative advantage.

    ``A = A_E + omega * A_S``. ``A_E = (R - mean_g R) / (std_g R + eps)`` over the
    trajectories of scope g (one value per trajectory, broadcast to its turns).
    ``A_S = (G_k - mean_a G) / (std_a G + eps)``, G_k the discounted return-to-go of the turn
    and a the anchor group: turns of the same group (and agent, when the scope has one) that
    start from the same state (``state_key``; exact match, or with ``similarity`` below 1
    the same cluster of keys, clustered within that group (and agent) by ``difflib`` ratio
    >= ``similarity``). Singleton anchor groups and unknown states give ``A_S = 0``.
    ``anchors="batch"`` pools the anchor states of the whole batch (per agent when the scope
    has one): every turn of the env's episodes that starts from the state, whatever its
    group -- our extension, for games where groups of different start states (or the same
    one) meet the same states, e.g. a board position in self-play.
    Shapes: ``[n_rows, T]``. Source: GiGPO (2025).
    """
    if not 0.0 < similarity <= 1.0:
        raise ValueError(f"bad similarity={similarity!r}; must be in (0, 1]")
    check_choice("anchors", anchors, ("group", "batch"))
    keep = keep_rows(batch, truncated)
    ids, n = scope_ids(batch, scope)
    a_episode = normalize(batch.returns.float(), ids, n, std=std, eps=eps,
                          include=keep & batch.last)
    G = rtg(batch, batch.reward.float(), discount)
    known = batch.state_id >= 0
    anchor_scope, _ = scope_ids(batch, anchors + ("_agent" if "agent" in scope else ""))
    state = batch.state_id
    if similarity < 1.0:
        state = _state_clusters(batch.state_keys, anchor_scope, state, similarity)
    aids, an = compact_ids(anchor_scope, state)
    member = keep & known
    a_step = normalize(G, aids, an, std=std, eps=eps, include=member)
    shared = segment_sum(member.float(), aids, an)[aids] > 1
    a_step = torch.where(known & shared, a_step, 0.0)
    return to_tokens(batch, torch.where(keep, a_episode + omega * a_step, 0.0))


class RoleEMA:
    """``role_ema``'s state across training steps: ``baselines`` maps ``"env/seat"`` to the
    running baseline. ``state_dict()`` is JSON-serialisable."""

    def __init__(self) -> None:
        self.baselines: dict[str, float] = {}

    def state_dict(self) -> dict:
        return {"baselines": dict(self.baselines)}

    def load_state_dict(self, state: dict) -> None:
        unknown = set(state) - {"baselines"}
        if unknown:
            raise ValueError(f"unknown RoleEMA state keys {sorted(unknown)}")
        self.baselines = {str(k): float(v) for k, v in state.get("baselines", {}).items()}


@estimator("role_ema", family="turn", needs=("agent", "env", "returns"), layout="any",
           source="SPIRAL (self-play on zero-sum games), 2025", keep=keep_rows, state=RoleEMA)
def role_ema(batch: TurnBatch, *, state: RoleEMA | None = None, decay: float = 0.95,
             init: float | None = 0.0, truncated: str = "mask") -> Tensor:
    """Role-conditioned advantage ``A = R - b[env, role]``, b an EMA of returns.

    b is read *before* the update ``b[env, role] <- decay * b + (1 - decay) * mean R[env,
    role]`` (mean over the batch's kept trajectories, one R each). A (env, role) seen for the
    first time starts at ``init`` (``None``: at its batch mean). With ``state`` (a `RoleEMA`)
    its baselines are read and then updated in place; with None nothing is kept.
    Non-finite returns never enter the baselines, and their rows get ``A = 0``.
    Shapes: ``[n_rows, T]``. Source: SPIRAL (2025); decay 0.95 as in the paper.
    """
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"bad decay={decay!r}; must be in [0, 1]")
    R = batch.returns.float()
    use = keep_rows(batch, truncated) & torch.isfinite(R)
    R = torch.where(use, R, 0.0)
    role, n = compact_ids(batch.env_id, batch.agent)
    names = [f"{batch.env_names[int(batch.env_id[i])]}/{int(batch.agent[i])}"
             for i in segment_first(role, n).tolist()]
    once = (use & batch.last).float()  # one R per trajectory
    count = segment_sum(once, role, n)
    mean = segment_sum(R * once, role, n) / count.clamp(min=1)
    old = {} if state is None else state.baselines
    b = torch.tensor([old.get(k, mean[i].item() if init is None else init)
                      for i, k in enumerate(names)], dtype=R.dtype, device=R.device)
    if state is not None:
        state.baselines = ema_update(old, names, mean, count, decay, init)
    return to_tokens(batch, torch.where(use, R - b[role], 0.0))


@estimator("gated", family="turn", needs=("group", "agent", "turn", "reward", "returns"),
           layout="turn", source="Gated Reward Accumulation (G-RA), 2025", keep=keep_rows)
def gated(batch: TurnBatch, *, threshold: float = 1.0, discount: float = 1.0,
          scope: str = "group_agent", std: bool = True, eps: float = 1e-6,
          truncated: str = "mask") -> Tensor:
    """Gated rewards: immediate turn rewards count only if the outcome reaches ``threshold``.

    ``r'_k = r_k * [R >= threshold] + [k last] * R`` with r the turn (immediate) reward and R
    the agent's outcome (``returns``); then the return-to-go over the agent's own turns and
    normalisation in ``scope`` as in `turn_rtg`. Shapes: ``[n_rows, T]``.
    Source: G-RA (2025); our reading of the abstract.
    """
    keep = keep_rows(batch, truncated)
    ret = batch.returns.float()
    G = rtg(batch, batch.reward.float() * (ret >= threshold) + ret * batch.last, discount)
    ids, n = scope_ids(batch, scope)
    adv = normalize(G, ids, n, std=std, eps=eps, include=keep)
    return to_tokens(batch, torch.where(keep, adv, 0.0))
