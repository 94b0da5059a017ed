"""Turn-level and multi-agent credit assignment (turn layout: one row per turn).

Common options:

* ``truncated``: ``"mask"`` (default) gives rows of episodes stopped by a turn budget a
  zero advantage, leaves them out of every statistic, and drops them from the loss (the
  estimators' ``keep``); ``"terminal"`` treats the truncation as a normal episode end.
* ``add_return``: also credit ``batch.returns`` (the agent's final return) to the agent's
  last turn, for environments that put the outcome in the returns and not in a turn reward.

Return-to-go over an agent's own turns uses `scan.rtg` (dense (trajectory, turn) grid,
one matmul); statistics use segment ops. No Python loop over rows or turns.
"""

from __future__ import annotations

import difflib

import torch
from torch import Tensor

from sparring.advantages import estimator
from sparring.advantages.normalize import (
    check_choice,
    ema_update,
    loo_baseline,
    normalize,
    scope_ids,
)
from sparring.advantages.scan import rtg, to_tokens
from sparring.data import TurnBatch
from sparring.segments import compact_ids, segment_sum

TRUNCATION = ("mask", "terminal")


def keep_rows(batch: TurnBatch, truncated: str = "mask", **_: object) -> Tensor:
    """``Bool[n]``: rows that enter statistics and the loss (see ``truncated``)."""
    check_choice("truncated", truncated, TRUNCATION)
    if truncated == "mask":
        return ~batch.truncated.bool()
    return torch.ones(batch.n_rows, dtype=torch.bool, device=batch.device)


def turn_rewards(batch: TurnBatch, add_return: bool = False) -> Tensor:
    """Per-row reward ``[n]``: the turn's reward (+ the agent's return on its last turn)."""
    r = batch.reward.float()
    return r + batch.returns.float() * batch.last if add_return else r


def _finish(adv: Tensor, keep: Tensor, batch: TurnBatch) -> Tensor:
    return to_tokens(torch.where(keep, adv, torch.zeros_like(adv)), batch)


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
    return _finish(normalize(G, ids, n, std=std, eps=eps, include=keep), keep, batch)


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
    return _finish(adv, keep, batch)


def _state_clusters(keys: list[str], threshold: float) -> Tensor:
    """Cluster id per distinct state key: a key joins the first earlier cluster whose
    representative has ``difflib`` ratio >= threshold. Loops over distinct keys, not rows."""
    reps: list[str] = []
    out = []
    for k in keys:
        for c, r in enumerate(reps):
            if difflib.SequenceMatcher(None, k, r).ratio() >= threshold:
                out.append(c)
                break
        else:
            out.append(len(reps))
            reps.append(k)
    return torch.tensor(out, dtype=torch.long)


@estimator("gigpo", family="turn", needs=("group", "state_key", "reward", "returns"),
           layout="turn", source="Group-in-Group Policy Optimization (GiGPO), 2025",
           keep=keep_rows)
def gigpo(batch: TurnBatch, *, omega: float = 1.0, discount: float = 0.95, std: bool = True,
          eps: float = 1e-6, scope: str = "group_agent", similarity: float = 1.0,
          truncated: str = "mask") -> Tensor:
    """GiGPO: episode-level plus anchor-state step-level relative advantage.

    ``A = A_E + omega * A_S``. ``A_E = (R - mean_g R) / (std_g R + eps)`` over the
    trajectories of scope g (one value per trajectory, broadcast to its turns).
    ``A_S = (G_k - mean_a G) / (std_a G + eps)``, G_k the discounted return-to-go of the turn
    and a the anchor group: turns of the same group (and agent, when the scope has one) that
    start from the same state (``state_key``; exact match, or ``difflib`` ratio >=
    ``similarity`` when below 1). Singleton anchor groups and unknown states give ``A_S = 0``.
    Shapes: ``[n_rows, T]``. Source: GiGPO (2025).
    """
    if not 0.0 < similarity <= 1.0:
        raise ValueError(f"bad similarity={similarity!r}; must be in (0, 1]")
    keep = keep_rows(batch, truncated)
    ids, n = scope_ids(batch, scope)
    a_ep = normalize(batch.returns.float(), ids, n, std=std, eps=eps, include=keep & batch.last)
    G = rtg(batch, batch.reward.float(), discount)
    known = batch.state_id >= 0
    state = batch.state_id.clamp(min=0)
    if similarity < 1.0 and batch.state_keys:
        state = _state_clusters(batch.state_keys, similarity).to(batch.device)[state]
    keys = [batch.group, state, known.long()]
    if "agent" in scope:
        keys.append(batch.agent)
    sids, sn = compact_ids(*keys) if batch.n_rows else (batch.group, 0)
    a_step = normalize(G, sids, sn, std=std, eps=eps, include=keep & known)
    cnt = segment_sum((keep & known).float(), sids, sn)[sids]
    a_step = torch.where(known & (cnt > 1), a_step, torch.zeros_like(a_step))
    return _finish(a_ep + omega * a_step, keep, batch)


def _role_keys(batch: TurnBatch) -> tuple[Tensor, int, list[str]]:
    ids, n = compact_ids(batch.env_id, batch.agent) if batch.n_rows else (batch.agent, 0)
    first = torch.zeros(n, dtype=torch.long).scatter_(0, ids.cpu(), torch.arange(batch.n_rows))
    names = [f"{batch.env_names[int(batch.env_id[i])]}/{int(batch.agent[i])}" for i in first]
    return ids, n, names


def role_ema_step(batch: TurnBatch, baselines: dict[str, float], *, decay: float = 0.95,
                  init: float | None = 0.0, truncated: str = "mask"
                  ) -> tuple[Tensor, dict[str, float]]:
    """Pure form of `RoleEMA`: (advantages ``[n_rows, T]``, updated baselines).

    ``A = R - b[env, role]`` with b read *before* the update, then
    ``b[env, role] <- decay * b + (1 - decay) * mean_batch R[env, role]`` (one R per
    trajectory). ``baselines`` maps ``"env/seat"`` to a float; it is not modified.
    """
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"bad decay={decay!r}; must be in [0, 1]")
    keep = keep_rows(batch, truncated)
    ids, n, names = _role_keys(batch)
    R = batch.returns.float()
    use = (keep & batch.last).float()
    cnt = segment_sum(use, ids, n)
    mean = segment_sum(R * use, ids, n) / cnt.clamp(min=1)
    start = [baselines.get(k, (mean[i].item() if init is None else init)) for i, k in
             enumerate(names)]
    b = torch.tensor(start, dtype=R.dtype, device=R.device)
    new = ema_update(baselines, names, mean, cnt, decay, init)
    return _finish(R - b[ids] if n else R, keep, batch), new


class RoleEMA:
    """SPIRAL's role-conditioned baseline with state: call it on each batch.

    ``adv = tracker(batch)`` reads the baselines, then updates them. ``state_dict()`` is
    JSON-serialisable (``{"decay", "init", "baselines": {"env/seat": float}}``).
    """

    def __init__(self, decay: float = 0.95, init: float | None = 0.0):
        self.decay, self.init = decay, init
        self.baselines: dict[str, float] = {}

    def __call__(self, batch: TurnBatch, truncated: str = "mask") -> Tensor:
        adv, self.baselines = role_ema_step(batch, self.baselines, decay=self.decay,
                                            init=self.init, truncated=truncated)
        return adv

    def state_dict(self) -> dict:
        return {"decay": self.decay, "init": self.init, "baselines": dict(self.baselines)}

    def load_state_dict(self, state: dict) -> None:
        unknown = set(state) - {"decay", "init", "baselines"}
        if unknown:
            raise ValueError(f"unknown RoleEMA state keys {sorted(unknown)}")
        self.decay = float(state.get("decay", self.decay))
        self.init = state.get("init", self.init)
        self.baselines = {str(k): float(v) for k, v in state.get("baselines", {}).items()}


@estimator("role_ema", family="turn", needs=("agent", "env", "returns"), layout="any",
           source="SPIRAL (self-play on zero-sum games), 2025", keep=keep_rows)
def role_ema(batch: TurnBatch, *, tracker: RoleEMA | None = None, decay: float = 0.95,
             init: float | None = 0.0, truncated: str = "mask") -> Tensor:
    """Role-conditioned advantage ``A = R - b[env, role]``, b an EMA of returns.

    With ``tracker`` (a `RoleEMA`) its baselines are read and then updated in place; without
    one, every (env, role) starts at ``init`` and nothing is kept (``init=None``: the batch
    mean). Shapes: ``[n_rows, T]``. Source: SPIRAL (2025); decay 0.95 per the catalogue.
    """
    if tracker is not None:
        return tracker(batch, truncated=truncated)
    return role_ema_step(batch, {}, decay=decay, init=init, truncated=truncated)[0]


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
    r = batch.reward.float() * (ret >= threshold) + ret * batch.last
    G = rtg(batch, r, discount)
    ids, n = scope_ids(batch, scope)
    return _finish(normalize(G, ids, n, std=std, eps=eps, include=keep), keep, batch)


from sparring.advantages import turn_dense  # noqa: E402,F401  (registers igpo, matchtir)
