"""The data model: Turn -> Episode -> TurnBatch.

* `Turn`: one agent's action in one episode (token ids, sampling log-probs, reward).
* `Episode`: the ordered turns of all seats, final per-seat returns, group id.
* `TurnBatch`: flat, right-padded tensors over rows plus per-row index vectors; what
  estimators, objectives and the learner see. One row is one turn (``layout="turn"``)
  or one agent's whole trajectory (``layout="trajectory"``).

Episodes round-trip losslessly through JSON lines (`save_jsonl` / `load_jsonl`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

LAYOUTS = ("turn", "trajectory")


@dataclass
class Turn:
    """One agent's action. ``logprobs``/``entropies`` have one entry per action token."""

    agent: int
    prompt_ids: list[int]
    action_ids: list[int]
    logprobs: list[float] | None = None
    entropies: list[float] | None = None
    reward: float = 0.0  # reward credited to this turn (to the acting agent)
    state_key: str | None = None  # env state before the action, for anchor grouping
    done: bool = False  # this turn ended the episode
    invalid: str | None = None  # None, "illegal" or "unparsable"
    prompt_text: str = ""
    action_text: str = ""
    extras: dict[str, float] = field(default_factory=dict)  # per-turn scalars (igpo, ...)
    # constrained decoding: per action token the token ids the sampler allowed (None for a
    # free token after an action prefix; the whole field None when nothing constrained)
    allowed_ids: list[list[int] | None] | None = None

    def __post_init__(self) -> None:
        n = len(self.action_ids)
        for name in ("logprobs", "entropies", "allowed_ids"):
            v = getattr(self, name)
            if v is not None and len(v) != n:
                raise ValueError(f"Turn.{name} has {len(v)} entries for {n} action tokens")


@dataclass
class Episode:
    """The turns of all seats in order, the final return of each seat, and the group."""

    env: str
    seed: int
    group: int
    num_agents: int
    turns: list[Turn] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)
    truncated: bool = False  # stopped by a turn budget, not by the game
    info: dict[str, Any] = field(default_factory=dict)

    def agent_turns(self, agent: int) -> list[Turn]:
        return [t for t in self.turns if t.agent == agent]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Episode:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown Episode fields {sorted(unknown)}")
        d = dict(d)
        d["turns"] = [Turn(**t) for t in d.get("turns", [])]
        return cls(**d)


def save_jsonl(path: str | Path, episodes: Iterable[Episode]) -> None:
    """Write one JSON object per line. Floats keep their exact repr, so this is lossless."""
    with open(path, "w", encoding="utf-8") as f:
        for ep in episodes:
            f.write(json.dumps(ep.to_dict(), ensure_ascii=False, allow_nan=True) + "\n")


def load_jsonl(path: str | Path) -> list[Episode]:
    with open(path, encoding="utf-8") as f:
        return [Episode.from_dict(json.loads(line)) for line in f if line.strip()]


@dataclass
class TurnBatch:
    """Padded tensors ``[n_rows, T]`` and per-row vectors ``[n_rows]``.

    Index vectors: ``group`` (episodes sharing a start state), ``episode`` (0..n_ep-1),
    ``agent`` (seat), ``turn`` (index among the agent's own turns; 0 in trajectory
    layout), ``step`` (position in the episode's turn order), ``traj`` (id of the
    (episode, agent) trajectory, 0..n_traj-1), ``env_id`` (index into ``env_names``),
    ``state_id`` (index into ``state_keys``, -1 when unknown), ``policy`` (index into
    ``policy_names``: the player of the row's seat, ``Episode.info["players"]``, which the
    arena fills with the players' names -- the policy names of a run with several
    policies; '' when an episode does not name them).
    Per-row scalars: ``reward`` (the turn's reward; in trajectory layout the sum over
    the agent's turns), ``returns`` (the agent's final episode return), ``last`` (the
    agent's last turn), ``truncated`` (the episode hit a turn budget), ``length``
    (action tokens), ``extras`` (named per-turn scalars, NaN where missing).
    ``allowed``: per row ``{position: allowed token ids}`` for tokens sampled under
    constrained decoding (None when no turn was constrained); pass it to
    `sparring.policy.forward.token_logprobs` to recompute the restricted log-probs.
    """

    layout: str
    input_ids: Tensor  # long [n, T]
    attention_mask: Tensor  # bool [n, T]
    action_mask: Tensor  # bool [n, T]: tokens the agent generated
    old_logp: Tensor  # float [n, T], 0 outside action_mask
    group: Tensor
    episode: Tensor
    agent: Tensor
    turn: Tensor
    step: Tensor
    traj: Tensor
    env_id: Tensor
    state_id: Tensor
    reward: Tensor
    returns: Tensor
    last: Tensor
    truncated: Tensor
    length: Tensor
    env_names: list[str] = field(default_factory=list)
    state_keys: list[str] = field(default_factory=list)
    extras: dict[str, Tensor] = field(default_factory=dict)
    entropy: Tensor | None = None  # float [n, T]
    ref_logp: Tensor | None = None  # float [n, T]
    values: Tensor | None = None  # float [n, T], critic values on action tokens
    learner_logp: Tensor | None = None  # float [n, T], the learner's log-probs before its update
    allowed: list[dict[int, list[int]] | None] | None = None  # per row, see docstring
    policy: Tensor | None = None  # long [n], index into policy_names
    policy_names: list[str] = field(default_factory=list)

    @property
    def n_rows(self) -> int:
        return self.input_ids.shape[0]

    @property
    def n_traj(self) -> int:
        return int(self.traj.max()) + 1 if self.n_rows else 0

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    def _tensor_fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def select(self, rows: Tensor | Sequence[int]) -> TurnBatch:
        """Rows ``rows`` (index ids unchanged, so global statistics stay meaningful)."""
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.device)
        out = {}
        for k, v in self._tensor_fields().items():
            if isinstance(v, Tensor):
                out[k] = v[idx]
            elif k == "extras":
                out[k] = {n: t[idx] for n, t in v.items()}
            elif k == "allowed" and v is not None:
                out[k] = [v[i] for i in idx.tolist()]
            else:
                out[k] = v
        return replace(self, **out)

    def to(self, device: str | torch.device) -> TurnBatch:
        out = {}
        for k, v in self._tensor_fields().items():
            if isinstance(v, Tensor):
                out[k] = v.to(device)
            elif k == "extras":
                out[k] = {n: t.to(device) for n, t in v.items()}
        return replace(self, **out)

    def with_fields(self, **kw: Any) -> TurnBatch:
        return replace(self, **kw)

    @classmethod
    def from_scalars(
        cls,
        rewards: Tensor | Sequence[float],
        group: Tensor | Sequence[int] | None = None,
        agent: Tensor | Sequence[int] | None = None,
        lengths: Tensor | Sequence[int] | None = None,
    ) -> TurnBatch:
        """One row per rollout with a scalar reward: the functional API's batch.

        ``T = max(lengths)`` (1 when no lengths): row i has ``lengths[i]`` action tokens.
        """
        r = torch.as_tensor(rewards, dtype=torch.float32).reshape(-1)
        n = r.shape[0]
        g = torch.zeros(n, dtype=torch.long) if group is None else torch.as_tensor(group).long()
        a = torch.zeros(n, dtype=torch.long) if agent is None else torch.as_tensor(agent).long()
        ln = torch.ones(n, dtype=torch.long) if lengths is None else torch.as_tensor(lengths).long()
        if g.shape != (n,) or a.shape != (n,) or ln.shape != (n,):
            raise ValueError("rewards, group, agent and lengths must all have shape [n]")
        T = int(ln.max()) if n else 1
        mask = torch.arange(T)[None, :] < ln[:, None]
        ar = torch.arange(n)
        zeros = torch.zeros(n, dtype=torch.long)
        return cls(
            layout="trajectory",
            input_ids=torch.zeros(n, T, dtype=torch.long),
            attention_mask=mask.clone(),
            action_mask=mask,
            old_logp=torch.zeros(n, T),
            group=g,
            episode=ar,
            agent=a,
            turn=zeros,
            step=zeros.clone(),
            traj=ar.clone(),
            env_id=zeros.clone(),
            state_id=torch.full((n,), -1, dtype=torch.long),
            reward=r,
            returns=r.clone(),
            last=torch.ones(n, dtype=torch.bool),
            truncated=torch.zeros(n, dtype=torch.bool),
            length=ln,
            env_names=["scalar"],
        )


def _trajectory_tokens(turns: list[Turn]) -> tuple[list[int], list[bool], list[float], list[float] | None]:
    """Concatenate an agent's turns into one sequence: prompt_0, action_0, new obs, action_1...

    Requires each prompt to extend the previous context (prompt_k + action_k); otherwise
    the trajectory is not one sequence the model saw, and the turn layout must be used.
    """
    ids: list[int] = []
    act: list[bool] = []
    lp: list[float] = []
    ent: list[float] | None = [] if all(t.entropies is not None for t in turns) else None
    for t in turns:
        if t.prompt_ids[: len(ids)] != ids:
            raise ValueError(
                "trajectory layout needs every prompt to extend the previous turn's context; "
                "this episode's history mode rewrites it, so collate with layout='turn'"
            )
        new_obs = t.prompt_ids[len(ids):]
        ids += new_obs + t.action_ids
        act += [False] * len(new_obs) + [True] * len(t.action_ids)
        lp += [0.0] * len(new_obs) + (t.logprobs or [0.0] * len(t.action_ids))
        if ent is not None:
            ent += [0.0] * len(new_obs) + list(t.entropies or [])
    return ids, act, lp, ent


def collate(
    episodes: Sequence[Episode],
    layout: str = "turn",
    pad_id: int = 0,
    agents: Sequence[int] | None = None,
) -> TurnBatch:
    """Flatten episodes into a `TurnBatch`.

    ``agents``: only rows of these seats (e.g. the seats the learner played); default all.
    Turns with no action tokens (moves of bots or other non-token players) make no row.
    Turn layout: a row is ``prompt_ids + action_ids`` with the action tokens masked in.
    Trajectory layout: a row is one agent's turns concatenated (see `_trajectory_tokens`).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
    env_names: list[str] = []
    policy_names: list[str] = []
    state_keys: dict[str, int] = {}
    extra_names = sorted({k for ep in episodes for t in ep.turns for k in t.extras})
    rows: list[dict[str, Any]] = []
    traj_ids: dict[tuple[int, int], int] = {}
    for e, ep in enumerate(episodes):
        if ep.env not in env_names:
            env_names.append(ep.env)
        seats = range(ep.num_agents) if agents is None else agents
        players = ep.info.get("players") or []
        for a in seats:
            # turns without action tokens (a bot's move) are context, not training rows
            a_turns = [(s, t) for s, t in enumerate(ep.turns) if t.agent == a and t.action_ids]
            if not a_turns:
                continue
            traj_ids[(e, a)] = len(traj_ids)
            ret = float(ep.returns[a]) if a < len(ep.returns) else 0.0
            player = str(players[a]) if a < len(players) else ""
            if player not in policy_names:
                policy_names.append(player)
            base = dict(group=ep.group, episode=e, agent=a, traj=traj_ids[(e, a)],
                        env_id=env_names.index(ep.env), returns=ret, truncated=ep.truncated,
                        policy=policy_names.index(player))
            if layout == "trajectory":
                ids, act, lp, ent = _trajectory_tokens([t for _, t in a_turns])
                first = a_turns[0][1]
                rows.append(dict(base, ids=ids, act=act, lp=lp, ent=ent, turn=0, step=a_turns[0][0],
                                 allowed=_allowed_positions([t for _, t in a_turns]),
                                 state=first.state_key, last=True,
                                 reward=sum(t.reward for _, t in a_turns),
                                 extras={k: first.extras.get(k, math.nan) for k in extra_names}))
                continue
            for k, (s, t) in enumerate(a_turns):
                n_p, n_a = len(t.prompt_ids), len(t.action_ids)
                rows.append(dict(
                    base, ids=t.prompt_ids + t.action_ids, act=[False] * n_p + [True] * n_a,
                    lp=[0.0] * n_p + (t.logprobs or [0.0] * n_a),
                    ent=None if t.entropies is None else [0.0] * n_p + list(t.entropies),
                    turn=k, step=s, state=t.state_key, last=k == len(a_turns) - 1,
                    allowed=_allowed_positions([t]),
                    reward=t.reward, extras={x: t.extras.get(x, math.nan) for x in extra_names}))
    n = len(rows)
    T = max((len(r["ids"]) for r in rows), default=1)
    lengths = torch.tensor([len(r["ids"]) for r in rows], dtype=torch.long)
    attn = torch.arange(T)[None, :] < lengths[:, None]

    def padded(key: str, fill: object, dtype: torch.dtype) -> Tensor:
        """One tensor per field from right-padded lists (one allocation, not one per row)."""
        return torch.tensor([r[key] + [fill] * (T - len(r[key])) for r in rows],
                            dtype=dtype).reshape(n, T)

    input_ids = padded("ids", pad_id, torch.long)
    act = padded("act", False, torch.bool)
    old_lp = padded("lp", 0.0, torch.float32)
    has_ent = n > 0 and all(r["ent"] is not None for r in rows)
    ent = padded("ent", 0.0, torch.float32) if has_ent else None
    state_id = [-1 if r["state"] is None else state_keys.setdefault(r["state"], len(state_keys))
                for r in rows]

    def vec(name: str, dtype: torch.dtype) -> Tensor:
        return torch.tensor([r[name] for r in rows], dtype=dtype)

    return TurnBatch(
        layout=layout, input_ids=input_ids, attention_mask=attn, action_mask=act, old_logp=old_lp,
        group=vec("group", torch.long), episode=vec("episode", torch.long),
        agent=vec("agent", torch.long), turn=vec("turn", torch.long), step=vec("step", torch.long),
        traj=vec("traj", torch.long), env_id=vec("env_id", torch.long),
        state_id=torch.tensor(state_id, dtype=torch.long),
        reward=vec("reward", torch.float32), returns=vec("returns", torch.float32),
        last=vec("last", torch.bool), truncated=vec("truncated", torch.bool),
        length=act.sum(1), env_names=env_names, state_keys=list(state_keys),
        extras={x: torch.tensor([r["extras"][x] for r in rows], dtype=torch.float32)
                for x in extra_names},
        entropy=ent,
        allowed=[r["allowed"] for r in rows] if any(r["allowed"] for r in rows) else None,
        policy=vec("policy", torch.long), policy_names=policy_names,
    )


def _allowed_positions(turns: list[Turn]) -> dict[int, list[int]] | None:
    """``{position in the row: allowed ids}`` of constrained action tokens (free ones, after
    an action prefix, are left out). A turn's action starts at ``len(prompt_ids)`` in both
    layouts (prompts extend the context)."""
    out = {len(t.prompt_ids) + j: a for t in turns if t.allowed_ids
           for j, a in enumerate(t.allowed_ids) if a is not None}
    return out or None
