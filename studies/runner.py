"""Run a grid of ``sparring train`` runs (arm x seed) and summarise it over seeds.

A study script declares its arms and metrics and hands them to `main`::

    from runner import Arm, main
    ARMS = {"grpo": Arm("kuhn_selfplay", ["algorithm.estimator=grpo"]), ...}
    main("my_study", ARMS, ["eval/kuhn_poker/exploitability"], steps=300, doc=__doc__)

Every study then takes the same options (``python studies/NAME.py --help``): ``--out DIR``
(default ``runs/studies/<study>``), ``--jobs N`` runs at a time (default 1), ``--seeds``
(default 0 1 2), ``--steps N`` and ``--set key=value`` (given to every run, for smoke
checks), ``--arms`` (a subset) and ``--summary-only``. Run (arm, seed) trains in
``OUT/<arm>/seed<S>/`` as ``python -m sparring train RECIPE OVERRIDES... train.steps=N
train.seed=S train.run_dir=DIR`` with ``OMP_NUM_THREADS=1``; its output goes to
``OUT/<arm>/seed<S>.log`` and ``DIR/study.json`` records its arguments, exit status and wall
seconds. A run whose ``metrics.jsonl`` already reaches step N (with the same arguments) is
reused, so an interrupted study resumes where it stopped; an incomplete one starts again.
The grid itself (planning, running, reuse, reading runs back, plots) is `sparring.grid`,
shared with ``sparring sweep``; this file adds the studies' arms, t intervals and CLI.

Summary (printed and written to ``OUT/summary.md``): for each metric, per arm, the final
values x_1..x_n of the n seeds and the Student-t 95% interval of their mean::

    mean = (1/n) sum_i x_i
    s    = sqrt( sum_i (x_i - mean)^2 / (n - 1) )
    h    = t_{0.975, n-1} * s / sqrt(n)            interval: mean +- h

with the t quantile from ``scipy.stats.t.ppf`` when scipy is importable, else from the table
`T975` (two-sided 95%). One PNG per curve in ``OUT/plots/``: per arm the mean over seeds
(thick) and each seed (thin), against the step, the episodes seen or the training time.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # a checkout without `pip install -e .`: use its src/
    sys.path.insert(0, str(REPO / "src"))
from sparring.grid import (  # noqa: E402, F401  (the machinery, re-exported for the studies)
    RECORD,
    Arm,
    Job,
    Run,
    _mean_curve,
    curve,
    final_step,
    is_complete,
    last,
    plan,
    plot,
    plot_name,
    record,
    rows,
    run_jobs,
    wall_time,
)
from sparring.report.plots import series  # noqa: E402

# t_{0.975, df}: the two-sided 95% Student-t quantile (df 1..30, then 40, 60, 120)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131,
        16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074,
        23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045,
        30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


# ---------------------------------------------------------------- statistics

def t975_table(df: int) -> float:
    """t_{0.975, df} from `T975`; between table rows, the row of the next smaller df (a
    slightly wider, conservative interval); beyond 120, 1.96."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    return 1.96 if df > 120 else T975[max(k for k in T975 if k <= df)]


def t_quantile(df: int) -> tuple[float, str]:
    """(t_{0.975, df}, where it came from: 'scipy' or 'table')."""
    try:
        from scipy.stats import t
    except ImportError:
        return t975_table(df), "table"
    return float(t.ppf(0.975, df)), "scipy"


def t_interval(values: Sequence[float]) -> tuple[float, float]:
    """(mean, h): the 95% Student-t interval mean +- h of the mean of ``values``,
    h = t_{0.975, n-1} s / sqrt(n), s the sample standard deviation (n - 1 divisor).
    One value: h = nan; none: (nan, nan)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, math.nan
    s = math.sqrt(sum((x - mean) ** 2 for x in values) / (n - 1))
    return mean, t_quantile(n - 1)[0] * s / math.sqrt(n)


# ---------------------------------------------------------------- summary

Metric = str | tuple[str, Callable[[Path], float | None]]  # a metrics.jsonl key, or (label, fn)


def _metric(m: Metric) -> tuple[str, Callable[[Path], float | None]]:
    return (m, lambda d: last(d, m)) if isinstance(m, str) else m


def tail_mean(key: str, k: int = 10) -> Metric:
    """A metric: the mean of the last ``k`` logged values of ``key`` (for noisy per-step
    training metrics such as ``reward``)."""
    def fn(run_dir: Path) -> float | None:
        _, ys = series(rows(run_dir), key)
        return sum(ys[-k:]) / len(ys[-k:]) if ys else None
    return f"{key} (mean of the last {k} steps)", fn


def _fmt(v: float) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.4g}"


def summary(runs: Sequence[Run], metrics: Sequence[Metric]) -> str:
    """Markdown: per metric, a table of arms with n seeds, mean, 95% t interval and the
    per-seed values; arms without any value of the metric are left out. Always ends with
    the wall seconds per run."""
    _, source = t_quantile(2)
    md = [f"Final values; mean over seeds with a 95% Student-t interval (mean +- h, "
          f"h = t_0.975,n-1 * s / sqrt(n); t quantile from {source})."]
    arms = list(dict.fromkeys(r.arm for r in runs))
    for label, fn in [*map(_metric, metrics), ("wall seconds per run", wall_time)]:
        lines = []
        for arm in arms:
            vals = [(r.seed, fn(r.dir)) for r in runs if r.arm == arm]
            xs = [v for _, v in vals if v is not None and math.isfinite(v)]
            if not xs:
                continue
            mean, h = t_interval(xs)
            ci = f"±{_fmt(h)} [{_fmt(mean - h)}, {_fmt(mean + h)}]" if math.isfinite(h) else "-"
            seeds = ", ".join(f"{s}: {_fmt(v)}" for s, v in vals)
            lines.append(f"| {arm} | {len(xs)} | {_fmt(mean)} | {ci} | {seeds} |")
        if lines:
            md += ["", f"### {label}", "", "| arm | n | mean | 95% CI | per seed |",
                   "|---|---|---|---|---|", *lines]
    return "\n".join(md) + "\n"


# ---------------------------------------------------------------- command line

def parse_args(study: str, doc: str | None, argv: Sequence[str] | None = None
               ) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"studies/{study}.py", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "runs" / "studies" / study,
                   help=f"output folder (default: runs/studies/{study})")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=None,
                   help="training steps of every run (default: the study's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override given to every run (repeatable)")
    p.add_argument("--arms", nargs="+", default=None,
                   help="run only these arms (the summary covers every arm with runs in --out)")
    p.add_argument("--summary-only", action="store_true",
                   help="run nothing: summarise the runs already in --out")
    args = p.parse_args(argv)
    args.out = args.out.resolve()
    return args


def main(study: str, arms: dict[str, Arm], metrics: Sequence[Metric], *, steps: int,
         curves: Sequence[tuple[str, str]] | None = None, doc: str | None = None,
         after: Callable[[list[Run], argparse.Namespace], list[Job]] | None = None,
         argv: Sequence[str] | None = None) -> int:
    """Run the study's grid, then print and write its summary and plots.

    ``curves``: (metrics.jsonl key, x) pairs to plot, x in step / episodes / time (default:
    each key of ``metrics`` against the step). ``after(runs, args)``: more jobs to run once
    the training runs are done (e.g. evaluations on another game), same ``--jobs``."""
    args = parse_args(study, doc, argv)
    chosen = list(arms) if args.arms is None else args.arms
    unknown = sorted(set(chosen) - set(arms))
    if unknown:
        raise SystemExit(f"--arms: unknown {unknown}; this study has {sorted(arms)}")
    runs = plan(arms, args.seeds, args.out, steps, args.set, args.steps)
    failed: list[str] = []
    if not args.summary_only:
        mine = [r for r in runs if r.arm in chosen]
        print(f"{study}: {len(chosen)} arms x {len(args.seeds)} seeds -> {args.out}", flush=True)
        failed = run_jobs([r.job() for r in mine], args.jobs, cwd=REPO)
        if after is not None:
            failed += run_jobs(after([r for r in mine if r.complete()], args), args.jobs,
                               cwd=REPO)
    md = [f"# Study {study}", "", summary(runs, metrics)]
    if curves is None:
        curves = [(m, "step") for m in metrics if isinstance(m, str)]
    pics = [p for key, x in curves
            if (p := plot(runs, key, args.out / "plots" / plot_name(key, x), x)) is not None]
    md += ["## Plots", "", *(f"![{p.stem}](plots/{p.name})" for p in pics), ""]
    text = "\n".join(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.md").write_text(text)
    print(text)
    print(f"summary: {args.out / 'summary.md'}; plots: {args.out / 'plots'}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
