"""The end-of-run summary: evaluation figures at the start and at the end, with intervals.

Reads the run's metrics with the report's own helpers (`sparring.report`), and prints the
headline evaluation keys (win / loss / non-loss rates, invalid-action rate, mean return,
exploitability, the exact rates against minimax and the policy's blunders) as a table.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from sparring.report import eval_point, format_point, metric_keys
from sparring.train.metrics import read_metrics

HEADLINE = ("non_loss", "win", "loss", "invalid_rate", "forfeit_rate", "exploitability",
            "exploitability_average", "mean_return", "blunder_states")


def print_summary(run_dir: str | Path, console: Console | None = None) -> None:
    rows = read_metrics(Path(run_dir))
    keys = [k for k in metric_keys(rows)[2] if k.rsplit("/", 1)[-1] in HEADLINE] if rows else []
    if not keys:
        return
    t = Table(title="evaluation: start -> end (Wilson 95% intervals)")
    for col in ("env / opponent", "metric", "games", "start", "end"):
        t.add_column(col, no_wrap=col not in ("start", "end"))
    for key in keys:
        where, _, metric = key[len("eval/"):].rpartition("/")
        s0, v0, lo0, hi0 = eval_point(rows, key, 0)
        s1, v1, lo1, hi1 = eval_point(rows, key, -1)
        games = next((r.get(key.rsplit("/", 1)[0] + "/games") for r in reversed(rows)
                      if key in r), None)
        t.add_row(where, metric, "-" if games is None else str(int(games)),
                  f"step {s0}: {format_point(v0, lo0, hi0)}",
                  f"step {s1}: {format_point(v1, lo1, hi1)}")
    (console or Console()).print(t)
