"""Metrics: ``metrics.jsonl`` (one line per step), a live progress bar, optional sinks.

TensorBoard and Weights & Biases are imported only when turned on; a missing package is
an error that says what to install.

Each row is flushed to disk as it is written; reading the file back, a torn last line is
dropped (`sparring.storage.metrics_file`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from sparring.extras import import_extra
from sparring.storage.metrics_file import METRICS_FILE

log = logging.getLogger(__name__)

def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if math.isfinite(v) else str(v)
    return str(v)


def bar_items(keys: list[str], metrics: dict[str, Any]) -> list[tuple[str, Any]]:
    """(label, value) of each of ``keys`` in ``metrics``; a key a run with several policies
    logs per policy (``policy/NAME/key``) is shown once per policy as ``NAME.key``."""
    out: list[tuple[str, Any]] = []
    for k in keys:
        if k in metrics:
            out.append((k, metrics[k]))
            continue
        for m, v in metrics.items():
            parts = m.split("/")
            if len(parts) == 3 and parts[0] == "policy" and parts[2] == k:
                out.append((f"{parts[1]}.{k}", v))
    return out


class ProgressBar:
    """A rich progress bar: steps done, elapsed, ETA and the latest key metrics."""

    def __init__(self, total: int, start: int, keys: list[str]):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        self.keys = keys
        self.progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 TextColumn("{task.fields[info]}"))
        self.task = self.progress.add_task("train", total=total, completed=start, info="")
        self.progress.start()

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        info = "  ".join(f"{k}={_fmt(v)}" for k, v in bar_items(self.keys, metrics))
        self.progress.update(self.task, completed=step, info=info)

    def close(self) -> None:
        self.progress.stop()


class MetricsLogger:
    """Appends each step's metrics to ``metrics.jsonl`` and forwards them to the sinks."""

    def __init__(self, run_dir: str | Path, *, total_steps: int, start_step: int = 0,
                 progress: bool = True, keys: list[str] | None = None,
                 tensorboard: bool = False, wandb: bool = False,
                 wandb_project: str = "sparring", config: dict[str, Any] | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self.tb = self.wandb = self.bar = None
        if tensorboard:
            SummaryWriter = import_extra("torch.utils.tensorboard", "tensorboard",  # noqa: N806
                                         "logging.tensorboard=true").SummaryWriter
            # a resumed run redoes the steps after its checkpoint: drop their old points
            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"),
                                    purge_step=start_step or None)
        if wandb:
            wb = import_extra("wandb", "wandb", "logging.wandb=true")
            # one W&B run per run folder, so a resumed run continues it
            run_id = hashlib.sha1(str(self.run_dir.resolve()).encode()).hexdigest()[:16]
            self.wandb = wb.init(project=wandb_project, dir=str(self.run_dir), config=config,
                                 name=self.run_dir.name, id=run_id, resume="allow")
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        if progress:
            self.bar = ProgressBar(total_steps, start_step, keys or [])

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **metrics}
        self._file.write(json.dumps(row, allow_nan=True) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        scalars = {k: v for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)
        if self.bar is not None:
            self.bar.update(step, metrics)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
        self._file.close()
