"""``metrics.jsonl``: one JSON object a line, one line per logged step.

It is the one file a run appends to rather than replaces, so a kill can tear its last line:
`read_metrics` drops a torn last line with a warning; an unreadable line before it is an
error that names the line.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from sparring.storage.atomic import atomic_write_text
from sparring.storage.bounded import (
    MAX_METRICS_BYTES,
    MAX_METRICS_LINE,
    loads_json_bounded,
    open_bounded,
    text_lines_bounded,
)

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` file (or of ``RUN_DIR/metrics.jsonl``): a regular
    file of at most `MAX_METRICS_BYTES`, lines of at most `MAX_METRICS_LINE` bytes, rows
    nested at most `MAX_JSON_DEPTH` levels (`sparring.storage.bounded`)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.exists():
        return []
    with open_bounded(path, MAX_METRICS_BYTES, "metrics file") as f:
        lines = [(n, line) for n, line in text_lines_bounded(f, path, MAX_METRICS_LINE,
                                                             "metrics file") if line.strip()]
    rows = []
    for k, (n, line) in enumerate(lines):
        try:
            row = loads_json_bounded(line)
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
