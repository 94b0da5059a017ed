"""An entropy bonus whose weight holds the policy's entropy near a target.

A fixed bonus ``c * H`` keeps a policy mixed only as long as ``c`` outweighs the
advantages, which shrink or grow as the run goes; a target says how mixed to stay. After
each update, with ``H`` the update's token-mean entropy of the action tokens (the logged
``entropy``) and ``H*`` = ``algorithm.entropy_target``:

    log c  <-  log c + r * (H* - H) / H*,        c_0 = algorithm.entropy_coef

so the weight grows while the policy is more deterministic than the target and shrinks
while it is more random (``r`` = ``algorithm.entropy_target_rate``: with ``H = 0`` the
weight grows by ``e^r`` an update). ``c`` stays within [`MIN_RATIO` * c_0, `MAX_COEF`]:
the floor is relative to the start so that a weight that fell while the policy was more
random than the target comes back within about ln(1 / MIN_RATIO) / (r * gap) updates
(with an absolute floor of 1e-6, a run took about 180 updates to recover).

This is SAC's automatic temperature (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms
and Applications": a dual step on ``alpha`` against an entropy target), in our reading for
an on-policy bonus: one step per update on the log of the weight, the gap divided by the
target so that one rate suits targets of any size. Eccles et al. 2019 ("Biases for
emergent communication") hold a speaker's entropy near a target for the same reason: a
code must stay exploratory until the listener can tell its symbols apart.
"""

from __future__ import annotations

import math
from typing import Any

MIN_RATIO = 0.01
MAX_COEF = 1.0


class EntropyTarget:
    """The adapted bonus weight ``coef`` (its state: that weight)."""

    def __init__(self, start: float, target: float, rate: float):
        if start <= 0 or target <= 0 or rate <= 0:
            raise ValueError(f"start, target and rate must be > 0, got {start}, {target}, {rate}")
        self.coef, self.target, self.rate = float(start), float(target), float(rate)
        self.floor = MIN_RATIO * self.coef

    def observe(self, entropy: float) -> float:
        """Move the weight after an update whose mean token entropy was ``entropy``."""
        step = self.rate * (self.target - entropy) / self.target
        self.coef = min(max(self.coef * math.exp(step), self.floor), MAX_COEF)
        return self.coef

    def state_dict(self) -> dict[str, Any]:
        return {"coef": self.coef}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.coef = float(state["coef"])
