"""The best checkpoint so far by one logged metric (``checkpoint.best_metric``).

Self-play curves are not monotone: Leduc's exploitability can touch its lowest point and
climb again as the policy turns deterministic (docs/benchmarks.md). `BestCheckpoint`
follows one metric over the run; at each step where it improves (strictly: lower with
``mode="min"``, higher with ``"max"``) the loop writes a full checkpoint of that step,
which `save_checkpoint` then keeps whatever ``checkpoint.keep`` says, and
``RUN/checkpoints/best.json`` records ``{"metric", "mode", "step", "value", "path"}``.
Evaluate it like any checkpoint: ``sparring eval RUN/checkpoints/step_000800``. Only
training steps count (the start-of-run evaluation has no checkpoint to keep).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

from sparring.storage.atomic import atomic_write_text
from sparring.storage.bounded import read_json_bounded
from sparring.storage.folders import CKPT_DIR

BEST_FILE = "best.json"


class BestCheckpoint:
    """Tracks ``metric`` (mode ``"min"``/``"max"``) for the run in ``run_dir``."""

    def __init__(self, run_dir: str | Path, metric: str, mode: str = "min") -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"checkpoint.best_mode={mode!r}; allowed: min, max")
        self.path = Path(run_dir) / CKPT_DIR / BEST_FILE
        self.metric, self.mode = metric, mode
        self.step: int | None = None
        self.value: float | None = None

    def resume(self, start: int) -> None:
        """Take up the record of a resumed run (ignored if another metric, or a step
        after the one resumed from: those steps run again)."""
        if not self.path.is_file():
            return
        doc = read_json_bounded(self.path, what="best checkpoint record")
        if (doc.get("metric"), doc.get("mode")) == (self.metric, self.mode) \
                and doc["step"] <= start:
            self.step, self.value = int(doc["step"]), float(doc["value"])

    def check_logged(self, metrics: Mapping[str, float], *, evaluated: bool) -> None:
        """Fail with the keys on offer where the metric should have been logged (every
        step, or the evaluation steps for an ``eval/`` metric) and was not."""
        due = evaluated or not self.metric.startswith("eval/")
        if due and self.metric not in metrics:
            kind = self.metric.startswith("eval/")
            near = sorted(k for k in metrics if k.startswith("eval/") == kind)
            raise ValueError(f"checkpoint.best_metric={self.metric!r} is not among the "
                             f"metrics logged at this step: {', '.join(near[:40])}")

    def offer(self, step: int, metrics: Mapping[str, float]) -> bool:
        """True when ``metrics`` improves on the best (NaN never does); records it."""
        value = metrics.get(self.metric)
        if value is None or math.isnan(value):
            return False
        better = self.value is None or (value < self.value if self.mode == "min"
                                        else value > self.value)
        if better:
            self.step, self.value = step, float(value)
        return better

    def write(self) -> None:
        """Record the best step (after its checkpoint is written)."""
        atomic_write_text(self.path, json.dumps(
            {"metric": self.metric, "mode": self.mode, "step": self.step,
             "value": self.value, "path": f"step_{self.step:06d}"}, indent=1))
