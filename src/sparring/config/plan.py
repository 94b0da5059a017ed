"""The plan of a training step: how many episodes each env spec plays and in which groups.

Pure functions of the config, with no model, env or file: the config's checks
(`sparring.config.config_warnings`) and the rollouts (`sparring.rollout.rollouts`,
`sparring.distributed`) read the same plan. ``episode_counts``: ``weight``-proportional
episodes per env spec, whole groups of ``group_size``; ``group_tasks``: the step's groups in
order, each spec's opponent kinds in turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparring.config import Config


def episode_counts(cfg: Config) -> list[int]:
    """Episodes per env spec this step: ``weight``-proportional, multiples of group_size."""
    total_w = sum(s.weight for s in cfg.envs) or 1.0
    out = []
    for s in cfg.envs:
        n = cfg.rollout.episodes_per_step * s.weight / total_w
        out.append(max(s.group_size, int(round(n / s.group_size)) * s.group_size))
    return out


@dataclass(frozen=True)
class GroupTask:
    """One group of a step: env spec ``spec`` (index in ``cfg.envs``), opponent kind ``kind``
    (index in its ``opponents``), the group's index ``index`` among that kind's groups, and
    its id ``group`` in the step (``Episode.group``)."""

    spec: int
    kind: int
    index: int
    group: int


def group_tasks(cfg: Config) -> list[GroupTask]:
    """The groups of every step, in order: per env spec, its opponent kinds in turn, each
    kind ``n_groups // len(kinds)`` groups (the first ``n_groups % len(kinds)`` one more)."""
    tasks: list[GroupTask] = []
    for i, (spec, n) in enumerate(zip(cfg.envs, episode_counts(cfg))):
        kinds = spec.opponents or ["self"]
        n_groups = n // spec.group_size
        for k in range(len(kinds)):
            g = n_groups // len(kinds) + (1 if k < n_groups % len(kinds) else 0)
            tasks += [GroupTask(i, k, j, len(tasks) + j) for j in range(g)]
    return tasks


__all__ = ["GroupTask", "episode_counts", "group_tasks"]
