"""One training step: rollouts -> TurnBatch -> advantages -> update, for every policy.

`TrainingStep` is the algorithm of a step and nothing else (the run's lifecycle, its
checkpoints and metrics log are `sparring.train.loop`'s):

1. ``episodes = rollout_fn(step)``, collated into one `TurnBatch`;
2. per policy, on its own rows (`policy_share`): ``learner.annotate`` adds what the
   advantage stage needs (critic values, ArCHer's utterance critic, reference log-probs);
3. ``adv, keep = stage(batch)``: reward shapers, estimator, advantage shapers, keep filters
   (`sparring.advantages.stage.AdvantageStage`); a rollout source that ``correct``s stale
   samples (`sparring.rollout.source.CorrectsStaleSamples`: the Ray workers) reweights them;
4. ``learner.update(batch, adv, keep)``: the clipped policy-gradient update over epochs and
   minibatches (`sparring.train.learner.Learner`: ratio = exp(logp - logp_old), the
   objective, the KL and entropy terms, the aggregation over tokens); with other learner
   ranks, the ``leader`` sends them each policy's rows first and they update alongside
   (`sparring.train.learner_ranks`).

Metrics: rewards per seat and env, advantage statistics, invalid-action rate and lengths
(`rollout_metrics`), each policy's learner and critic figures under ``policy/NAME/`` when a
run has several, and the step's timings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from sparring.advantages.stage import AdvantageStage
from sparring.config import Config
from sparring.data import Episode, TurnBatch, collate
from sparring.rollout.source import (
    CorrectsStaleSamples,
    ReportsLeague,
    ReportsRolloutMetrics,
    RolloutSource,
)
from sparring.segments import segment_first
from sparring.train.learner_ranks import Leader
from sparring.train.policies import TrainedPolicy, check_rows


def batch_layout(cfg: Config, stages: Sequence[AdvantageStage]) -> str:
    """The layout the stages' estimators need (config validation makes them agree), or
    ``rollout.layout`` when they all work on either."""
    return next((s.layout for s in stages if s.layout != "any"), cfg.rollout.layout)


def advantage_metrics(batch: TurnBatch, adv: Tensor, keep: Tensor) -> dict[str, float]:
    """Mean and std of the advantages on the kept action tokens, share of rows kept."""
    m = batch.action_mask & keep[:, None]
    a = adv[m]
    return {"adv_mean": float(a.mean()) if a.numel() else 0.0,
            "adv_std": float(a.std()) if a.numel() > 1 else 0.0,
            "kept_rows": float(keep.float().mean()) if keep.numel() else 0.0}


def rollout_metrics(episodes: Sequence[Episode], batch: TurnBatch, adv: Tensor,
                    keep: Tensor) -> dict[str, float]:
    """Rewards per seat and env, advantage stats, invalid-action rate and response length
    (of the policy's own samples), the share of explored moves,
    lengths."""
    out: dict[str, float] = {"episodes": float(len(episodes))}
    if batch.n_rows:
        first = segment_first(batch.traj, batch.n_traj)
        ret, env = batch.returns[first], batch.env_id[first]
        out["reward"] = float(ret.mean())
        for k, name in enumerate(batch.env_names):
            sel = ret[env == k]
            if len(sel):
                out[f"env/{name}/return"] = float(sel.mean())
    seats: dict[int, list[float]] = {}
    for ep in episodes:
        for s, r in enumerate(ep.returns):
            seats.setdefault(s, []).append(float(r))
    for s, rs in sorted(seats.items()):
        out[f"return/seat{s}"] = sum(rs) / len(rs)
    rows = [t for ep in episodes for t in ep.turns if t.action_ids]
    turns = [t for t in rows if "explored" not in t.extras]  # the policy's own samples
    if len(turns) < len(rows):  # exploration.learner: the share of moves drawn at random
        out["explored_rate"] = 1.0 - len(turns) / len(rows)
    out["invalid_rate"] = sum(t.invalid is not None for t in turns) / max(len(turns), 1)
    out["response_length"] = sum(len(t.action_ids) for t in turns) / max(len(turns), 1)
    out["episode_length"] = sum(len(ep.turns) for ep in episodes) / max(len(episodes), 1)
    out.update(advantage_metrics(batch, adv, keep))
    return out


class TrainingStep:
    """Steps 1-4 of the module docstring over ``policies`` (each a learner and an advantage
    stage) on ``rollout_fn``'s episodes, collated with ``layout`` and ``pad_id``."""

    def __init__(self, policies: list[TrainedPolicy], rollout_fn: RolloutSource, layout: str,
                 pad_id: int = 0, leader: Leader | None = None):
        self.policies, self.rollout_fn, self.layout, self.pad_id = (
            policies, rollout_fn, layout, pad_id)
        self.leader = leader  # other learner ranks take part in the updates
        # the rollout source's optional hooks (sparring.rollout.source)
        self.correct = rollout_fn.correct if isinstance(rollout_fn, CorrectsStaleSamples) else None
        self.league = rollout_fn.league_metrics if isinstance(rollout_fn, ReportsLeague) else None
        self.rollout_metrics = (rollout_fn.rollout_metrics
                                if isinstance(rollout_fn, ReportsRolloutMetrics) else None)

    def __call__(self, i: int, before_update: Callable[[], None] = lambda: None
                 ) -> dict[str, Any]:
        """Training step ``i`` (0-based): its metrics. ``before_update`` runs once the batch
        is collated, before anything changes the policies (the rollouts change only the
        RNGs and the rollout source's own state)."""
        # 1. rollouts
        t0 = time.perf_counter()
        episodes = list(self.rollout_fn(i))
        t1 = time.perf_counter()
        batch = collate(episodes, layout=self.layout, pad_id=self.pad_id).to(
            self.policies[0].learner.device)
        check_rows(batch, self.policies)
        if self.leader is not None:  # a lost rank is found here, before the policies move
            self.leader.begin_update(i)
        before_update()
        # 2-3. each policy's rows: what its stage needs, then its advantages and keep flags
        shares = [policy_share(p, batch) for p in self.policies]
        off_policy: dict[str, float] = {}
        if self.correct is not None:  # e.g. async rollout workers: stale samples
            for sh in shares:           # reweighted, each policy's against its own learner
                sh.batch, sh.adv, corrected = self.correct(i, sh.batch, sh.adv,
                                                           sh.policy.learner)
                off_policy.update(sh.policy.metrics(corrected))
        metrics = self.batch_metrics(episodes, batch, shares)
        if self.rollout_metrics is not None:  # e.g. rollout workers: restarts, staleness
            metrics.update(self.rollout_metrics())
        metrics.update(off_policy)
        if self.league is not None:  # the opponent pool's scores (sparring.rollout.league)
            metrics.update(self.league())
        # 4. the update: each policy on its own rows (on every learner rank)
        if self.leader is not None:
            self.leader.send_rows([(sh.batch, sh.adv, sh.keep) for sh in shares])
        for sh in shares:
            learner = sh.policy.learner
            metrics.update(sh.policy.metrics(learner.update(sh.batch, sh.adv, sh.keep)))
        if self.leader is not None:
            self.leader.end_update()
        t2 = time.perf_counter()
        n_tok = sum(len(t.action_ids) for ep in episodes for t in ep.turns)
        metrics.update({"time/rollout": t1 - t0, "time/update": t2 - t1,
                        "throughput/episodes_per_s": len(episodes) / max(t1 - t0, 1e-9),
                        "throughput/tokens_per_s": n_tok / max(t1 - t0, 1e-9)})
        return metrics

    def batch_metrics(self, episodes: Sequence[Episode], batch: TurnBatch,
                      shares: list[PolicyShare]) -> dict[str, Any]:
        """`rollout_metrics` over all rows (the policies' advantages put back in place),
        then each policy's advantage and critic metrics under its name (the one policy of
        a run has none, so its advantage stats are the same keys, computed the same way)."""
        metrics = rollout_metrics(episodes, batch, *merge_shares(batch, shares))
        for sh in shares:
            metrics.update(sh.policy.metrics(advantage_metrics(sh.batch, sh.adv, sh.keep)))
            metrics.update(sh.policy.metrics(sh.critic_metrics))
        return metrics


@dataclass
class PolicyShare:
    """One policy's part of a step: its rows of the batch (None: all of them), annotated
    by its learner, and its stage's advantages ``[n, T]`` and keep flags ``[n]``."""

    policy: TrainedPolicy
    rows: Tensor | None
    batch: TurnBatch
    adv: Tensor
    keep: Tensor
    critic_metrics: dict[str, float]


def policy_share(p: TrainedPolicy, batch: TurnBatch) -> PolicyShare:
    """Steps 2-3 of the module docstring for policy ``p`` on its rows of ``batch``: what its
    stage needs from its learner (values, a critic update, reference log-probs), then its
    advantages and keep flags."""
    rows = p.rows(batch)
    mine = batch if rows is None else batch.select(rows)
    if rows is not None and not mine.n_rows:  # e.g. bots had its seats: an empty update
        return PolicyShare(p, rows, mine, torch.zeros(mine.action_mask.shape, device=mine.device),
                      torch.zeros(0, dtype=torch.bool, device=mine.device), {})
    mine, critic_metrics = p.learner.annotate(mine, p.stage.needs)
    adv, keep = p.stage(mine)
    return PolicyShare(p, rows, mine, adv, keep, critic_metrics)


def merge_shares(batch: TurnBatch, shares: list[PolicyShare]) -> tuple[Tensor, Tensor]:
    """The policies' advantages ``[n, T]`` and keep flags ``[n]`` put back in ``batch``'s
    row order (a share whose ``rows`` is None has every row)."""
    adv = torch.zeros(batch.action_mask.shape, dtype=torch.float32, device=batch.device)
    keep = torch.zeros(batch.n_rows, dtype=torch.bool, device=batch.device)
    for sh in shares:
        rows = (torch.arange(batch.n_rows) if sh.rows is None else sh.rows).to(batch.device)
        adv[rows] = sh.adv.to(batch.device, torch.float32)
        keep[rows] = sh.keep.to(batch.device)
    return adv, keep
