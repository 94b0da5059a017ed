"""Learning-rate schedules as a function of the training step.

* ``constant``: lr
* ``warmup``:   lr * min(1, (s + 1) / W)
* ``cosine``:   warm-up as above, then lr * (m + (1 - m) * (1 + cos(pi * p)) / 2) with
  p = (s - W) / (S - W) the progress after warm-up and m = ``final_ratio``

``s`` counts updates from 0, ``W`` = warm-up steps, ``S`` = total steps.
"""

from __future__ import annotations

import math
from typing import Any

import torch

SCHEDULES = ("constant", "warmup", "cosine")


def lr_at(step: int, *, lr: float, schedule: str, warmup_steps: int = 0, total_steps: int = 1,
          final_ratio: float = 0.0) -> float:
    """The learning rate of update number ``step`` (0-based)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    warm = min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    if schedule == "constant":
        return lr
    if schedule == "warmup" or step < warmup_steps:
        return lr * warm
    span = max(total_steps - warmup_steps, 1)
    p = min(max(step - warmup_steps, 0) / span, 1.0)
    return lr * (final_ratio + (1 - final_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


class LRSchedule:
    """Sets the optimizer's lr before each update (times a group's ``lr_scale``, if it has
    one: `sparring.train.param_groups`); its state is the update count."""

    def __init__(self, optimizer: torch.optim.Optimizer, **kw: Any):
        self.optimizer, self.kw, self.step_count = optimizer, kw, 0
        self.apply()

    def current(self) -> float:
        return lr_at(self.step_count, **self.kw)

    def apply(self) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = self.current() * g.get("lr_scale", 1.0)

    def step(self) -> None:
        self.step_count += 1
        self.apply()

    def state_dict(self) -> dict[str, Any]:
        return {"step_count": self.step_count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_count = int(state["step_count"])
        self.apply()
