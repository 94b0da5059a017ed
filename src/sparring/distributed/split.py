"""Which rollout worker plays which groups of a step.

`split_groups(tasks, sizes, n)` cuts the step's group list (`sparring.rollout.rollouts.
group_tasks`) into ``n`` contiguous shares with about equal episode counts: a group goes to
share ``w`` when its middle episode lies in the ``w``-th ``1/n`` of the step's episodes
(with no more groups than workers: one group each). Contiguous shares, concatenated in
worker order, are the step's groups in order, so the driver's batch is the single-process
batch. The split depends only on the config, never on timing, so a replaced worker gets
exactly the share the dead one had.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def split_groups(tasks: Sequence[T], sizes: Sequence[int], n: int) -> list[list[T]]:
    """``n`` contiguous shares of ``tasks`` (``sizes[i]``: episodes of task ``i``); a share
    is empty when there are fewer groups than workers."""
    if n < 1:
        raise ValueError(f"split_groups: n={n}; need at least one share")
    if len(sizes) != len(tasks):
        raise ValueError(f"split_groups: {len(sizes)} sizes for {len(tasks)} tasks")
    shares: list[list[T]] = [[] for _ in range(n)]
    if len(tasks) <= n:  # a group each, the last workers idle
        for w, task in enumerate(tasks):
            shares[w].append(task)
        return shares
    total = sum(sizes)
    done = 0  # episodes of the tasks before this one
    for task, size in zip(tasks, sizes):
        # the share whose part of the step holds the task's middle episode
        shares[min(n - 1, (2 * done + size) * n // (2 * total))].append(task)
        done += size
    return shares
