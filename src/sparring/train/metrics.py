"""Metrics: ``metrics.jsonl`` (one line per step), a live progress bar, optional sinks.

TensorBoard and Weights & Biases are imported only when turned on; a missing package is
an error that says what to install.

``metrics.jsonl`` is the one file a run appends to rather than replaces (each row is
flushed to disk as it is written), so a kill can tear its last line: `read_metrics` drops
a torn last line with a warning; an unreadable line before it is an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from sparring.extras import import_extra
from sparring.train.atomic import atomic_write_text

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` file (or of ``RUN_DIR/metrics.jsonl``)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.exists():
        return []
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    rows = []
    for k, (n, line) in enumerate(lines):
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            if k == len(lines) - 1:  # the row being written when the run was killed
                log.warning("%s: dropping its torn last line %d (%s)", path, n, e)
                break
            raise ValueError(f"{path}: line {n} is not a metrics row ({e}); "
                             "repair or delete that line") from None
        rows.append(row)
    return rows


def truncate_metrics(path: str | Path, max_step: int) -> None:
    """Drop rows after ``max_step`` (the steps a resumed run will redo) and a torn last
    line, atomically."""
    path = Path(path)
    if not path.exists():
        return
    rows = [r for r in read_metrics(path) if r.get("step", 0) <= max_step]
    atomic_write_text(path, "".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))


def set_aside_metrics(run_dir: str | Path) -> Path | None:
    """Rename ``RUN_DIR/metrics.jsonl`` to ``metrics.stale-<time>.jsonl`` (for a fresh
    run in a folder whose earlier run stopped before its first checkpoint); returns the
    new name, None when there was no file."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return None
    aside = path.with_name(f"metrics.stale-{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"metrics.stale-{time.strftime('%Y%m%d-%H%M%S')}-{n}.jsonl")
    os.rename(path, aside)
    log.warning("%s holds metrics but no checkpoint (an earlier run stopped before its first "
                "checkpoint): moved them to %s and starting afresh", run_dir, aside.name)
    return aside


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
