"""The end-of-run summary: evaluation figures at the start and at the end, with intervals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def eval_rows(run_dir: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """(step, eval metrics) for every step that logged ``eval/...`` keys."""
    out = []
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        ev = {k[5:]: v for k, v in rec.items() if k.startswith("eval/")}
        if ev:
            out.append((int(rec.get("step", 0)), ev))
    return out


def summary_table(run_dir: str | Path) -> list[dict[str, Any]]:
    """One row per evaluated quantity: name, first (step, value, lo, hi), last (...)."""
    rows = eval_rows(run_dir)
    if not rows:
        return []
    (s0, first), (s1, last) = rows[0], rows[-1]
    table = []
    for key in last:
        if key.endswith(("_lo", "_hi")) or key.endswith("/games"):
            continue
        if not (key.endswith(("non_loss", "win", "loss", "invalid_rate", "exploitability",
                              "exploitability_average",
                              "mean_return"))):
            continue
        table.append(dict(name=key, start_step=s0, start=first.get(key),
                          start_lo=first.get(f"{key}_lo"), start_hi=first.get(f"{key}_hi"),
                          end_step=s1, end=last[key], end_lo=last.get(f"{key}_lo"),
                          end_hi=last.get(f"{key}_hi"), games=last.get(
                              key.rsplit("/", 1)[0] + "/games")))
    return table


def _fmt(v: Any, lo: Any, hi: Any) -> str:
    if v is None:
        return "-"
    s = f"{v:.3f}"
    return s + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "")


def print_summary(run_dir: str | Path, console: Console | None = None) -> None:
    rows = summary_table(run_dir)
    if not rows:
        return
    console = console or Console()
    t = Table(title="evaluation: start -> end (Wilson 95% intervals)")
    for col in ("env / opponent", "metric", "games", "start", "end"):
        t.add_column(col, no_wrap=col != "end" and col != "start")
    for r in rows:
        where, _, metric = r["name"].rpartition("/")
        t.add_row(where, metric, "-" if r["games"] is None else str(int(r["games"])),
                  f"step {r['start_step']}: " + _fmt(r["start"], r["start_lo"], r["start_hi"]),
                  f"step {r['end_step']}: " + _fmt(r["end"], r["end_lo"], r["end_hi"]))
    console.print(t)
