"""The end-of-run summary: evaluation figures at the start and at the end of a run.

Reads the run's metrics with the report's own helpers (`sparring.report.plots`), and prints the
headline evaluation keys (win / loss / non-loss rates, invalid-action rate, mean return,
exploitability, the exact rates against minimax and the policy's blunders) as a table that
fits an 80-column terminal: one group of rows per environment and opponent (with its number
of games), one row per metric, the start and the end in columns of their own. A sampled
rate carries ``±`` half the width of its Wilson 95% interval (the interval itself is in
``metrics.jsonl`` as ``<key>_lo`` / ``<key>_hi`` and in ``sparring report``'s plots).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sparring.report.plots import eval_point, metric_keys
from sparring.storage.metrics_file import read_metrics

HEADLINE = ("non_loss", "win", "loss", "invalid_rate", "forfeit_rate", "exploitability",
            "exploitability_average", "mean_return", "blunder_states")


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def format_value(value: float, lo: Any = None, hi: Any = None) -> str:
    """``0.4825 ±0.049``: the value (4 significant digits) and half its interval's width
    (2 significant digits); the value alone without an interval."""
    text = f"{value:.4g}"
    if _num(lo) and _num(hi):
        text += f" ±{(hi - lo) / 2:.2g}"
    return text


def summary_table(rows: Sequence[dict[str, Any]]) -> Table | None:
    """The table of the headline evaluation keys in ``rows`` (a run's metrics), or None
    when the run logged none."""
    keys = [k for k in metric_keys(rows)[2] if k.rsplit("/", 1)[-1] in HEADLINE] if rows else []
    if not keys:
        return None
    groups: dict[str, list[tuple[str, tuple, tuple]]] = {}
    for key in keys:
        where, _, metric = key[len("eval/"):].rpartition("/")
        groups.setdefault(where, []).append((metric, eval_point(rows, key, 0),
                                             eval_point(rows, key, -1)))
    # the steps most keys start and end at name the columns; a key logged at other steps
    # (an evaluation added or dropped along the run) says its own
    points = [p for group in groups.values() for p in group]
    first = Counter(p[1][0] for p in points).most_common(1)[0][0]
    last = Counter(p[2][0] for p in points).most_common(1)[0][0]

    def cell(point: tuple, usual: int) -> str:
        step, value, lo, hi = point
        return format_value(value, lo, hi) + ("" if step == usual else f" (step {step})")

    t = Table(title=f"evaluation: start (step {first}) -> end (step {last})",
              caption="±: half the width of the Wilson 95% interval", caption_justify="left")
    t.add_column("env / opponent, metric", overflow="fold")
    t.add_column("games", justify="right", no_wrap=True)
    t.add_column("start", justify="right", no_wrap=True)
    t.add_column("end", justify="right", no_wrap=True)
    for where, group in groups.items():
        games = next((r.get(f"eval/{where}/games") for r in reversed(rows)
                      if f"eval/{where}/games" in r), None)
        t.add_row(f"[bold]{where}[/bold]", "-" if games is None else str(int(games)),
                  "", "", end_section=False)
        for metric, start, end in group:
            t.add_row(f"  {metric}", "", cell(start, first), cell(end, last))
    return t


def print_summary(run_dir: str | Path, console: Console | None = None) -> None:
    table = summary_table(read_metrics(Path(run_dir)))
    if table is not None:
        (console or Console()).print(table)
