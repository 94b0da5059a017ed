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
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
try:
    from sparring.report import _smooth, series
    from sparring.train.metrics import read_metrics
except ImportError:  # a checkout without `pip install -e .`: use its src/
    sys.path.insert(0, str(REPO / "src"))
    from sparring.report import _smooth, series
    from sparring.train.metrics import read_metrics

# t_{0.975, df}: the two-sided 95% Student-t quantile (df 1..30, then 40, 60, 120)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131,
        16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074,
        23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045,
        30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
RECORD = "study.json"


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


# ---------------------------------------------------------------- reading runs

def rows(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of ``run_dir/metrics.jsonl`` ([] when there is none)."""
    return [r for r in read_metrics(Path(run_dir)) if isinstance(r.get("step"), int)]


def final_step(run_dir: str | Path) -> int | None:
    steps = [r["step"] for r in rows(run_dir)]
    return max(steps) if steps else None


def record(run_dir: str | Path) -> dict[str, Any] | None:
    path = Path(run_dir) / RECORD
    return json.loads(path.read_text()) if path.exists() else None


def is_complete(run_dir: str | Path, steps: int, args: Sequence[str] | None = None) -> bool:
    """The run's metrics reach step ``steps``, and its record (if any) has ``args``."""
    last = final_step(run_dir)
    if last is None or last < steps:
        return False
    rec = record(run_dir)
    return args is None or rec is None or rec.get("args") == list(args)


def last(run_dir: str | Path, key: str) -> float | None:
    """The last logged value of ``key`` (None when it was never logged)."""
    _, ys = series(rows(run_dir), key)
    return ys[-1] if ys else None


def _x_of_step(rs: list[dict[str, Any]], x: str) -> dict[int, float]:
    """Step -> x: the step itself, the episodes seen up to it, or its training seconds
    (cumulative time/rollout + time/update: without start-up, evaluation, checkpoints)."""
    if x == "step":
        return {r["step"]: float(r["step"]) for r in rs}
    if x not in ("episodes", "time"):
        raise ValueError(f"x must be step, episodes or time, got {x!r}")
    out, total = {0: 0.0}, 0.0
    for r in sorted((r for r in rs if "time/update" in r), key=lambda r: r["step"]):
        total += r.get("episodes", 0.0) if x == "episodes" else \
            r["time/rollout"] + r["time/update"]
        out[r["step"]] = total
    return out


def curve(run_dir: str | Path, key: str, x: str = "step") -> tuple[list[float], list[float]]:
    """(xs, ys) of ``key``; x: 'step', 'episodes' (seen so far) or 'time' (training s)."""
    rs = rows(run_dir)
    xmap = _x_of_step(rs, x)
    steps, ys = series(rs, key)
    pts = [(xmap[s], y) for s, y in zip(steps, ys) if s in xmap]
    return [p[0] for p in pts], [p[1] for p in pts]


def wall_time(run_dir: str | Path) -> float | None:
    """The run's wall seconds as recorded by the runner, else the sum of its time/* keys."""
    rec = record(run_dir)
    if rec and rec.get("wall_s") is not None:
        return float(rec["wall_s"])
    rs = rows(run_dir)
    total = sum(v for r in rs for k, v in r.items() if k.startswith("time/"))
    return total if rs else None


# ---------------------------------------------------------------- the grid

@dataclass(frozen=True)
class Arm:
    """A recipe (name in configs/ or YAML path) and its overrides; ``steps``: this arm's
    training steps (None: the study's)."""

    recipe: str
    overrides: Sequence[str] = ()
    steps: int | None = None


@dataclass
class Run:
    arm: str
    seed: int
    dir: Path
    steps: int
    args: list[str]  # the arguments after `sparring train`, without train.run_dir

    @property
    def log(self) -> Path:
        return self.dir.with_suffix(".log")

    def complete(self) -> bool:
        return is_complete(self.dir, self.steps, self.args)

    def job(self) -> Job:
        def before() -> None:
            if self.dir.exists():  # incomplete or stale: start it again
                shutil.rmtree(self.dir)

        def after(rc: int, wall: float) -> None:
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / RECORD).write_text(json.dumps(
                {"arm": self.arm, "seed": self.seed, "args": self.args, "returncode": rc,
                 "wall_s": wall}, indent=1))

        cmd = [sys.executable, "-m", "sparring", "train", *self.args,
               f"train.run_dir={self.dir}"]
        return Job(f"{self.arm} seed {self.seed}", cmd, self.log, self.complete, before, after)


@dataclass
class Job:
    """A command to run unless ``done()``; ``before`` runs first, ``after(rc, wall_s)``
    once it ended."""

    name: str
    cmd: list[str]
    log: Path
    done: Callable[[], bool]
    before: Callable[[], None] = field(default=lambda: None)
    after: Callable[[int, float], None] = field(default=lambda rc, wall: None)


def plan(arms: dict[str, Arm], seeds: Sequence[int], out: Path, steps: int,
         extra: Sequence[str] = (), steps_override: int | None = None) -> list[Run]:
    """Every (arm, seed) run: overrides, then ``extra``, then steps, seed, no progress bar."""
    runs = []
    for name, arm in arms.items():
        n = steps_override or arm.steps or steps
        for seed in seeds:
            args = [arm.recipe, *arm.overrides, *extra, f"train.steps={n}",
                    f"train.seed={seed}", "logging.progress=false"]
            runs.append(Run(name, seed, out / name / f"seed{seed}", n, args))
    return runs


def run_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH"))
                                        if p)
    return env


def run_jobs(jobs: Sequence[Job], n: int = 1) -> list[str]:
    """Run the jobs not yet done, ``n`` at a time, each as a subprocess from the repo root
    with its stdout and stderr in its log; returns the names of those that failed."""
    todo = [j for j in jobs if not j.done()]
    if len(todo) < len(jobs):
        print(f"{len(jobs) - len(todo)} of {len(jobs)} already done, reused", flush=True)
    env, failed = run_env(), []

    def one(job: Job) -> tuple[Job, int, float]:
        job.before()
        job.log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(job.log, "w") as log:
            rc = subprocess.run(job.cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL).returncode
        wall = time.perf_counter() - t0
        job.after(rc, wall)
        return job, rc, wall

    with ThreadPoolExecutor(max_workers=max(1, n)) as pool:
        for k, fut in enumerate(as_completed([pool.submit(one, j) for j in todo]), 1):
            job, rc, wall = fut.result()
            state = "ok" if rc == 0 else f"FAILED (exit {rc}), see {job.log}"
            print(f"[{k}/{len(todo)}] {job.name}: {wall:.0f} s, {state}", flush=True)
            if rc != 0:
                failed.append(job.name)
    return failed


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


def _mean_curve(curves: list[tuple[list[float], list[float]]]
                ) -> tuple[list[float], list[float]]:
    """Mean over seeds: pointwise when the seeds share their x values, else on 100 points
    of their common x range (linear interpolation)."""
    import numpy as np

    curves = [c for c in curves if c[0]]
    if not curves:
        return [], []
    if all(c[0] == curves[0][0] for c in curves):
        return curves[0][0], list(np.mean([c[1] for c in curves], axis=0))
    lo, hi = max(c[0][0] for c in curves), min(c[0][-1] for c in curves)
    if hi <= lo:
        return [], []
    grid = np.linspace(lo, hi, 100)
    return list(grid), list(np.mean([np.interp(grid, c[0], c[1]) for c in curves], axis=0))


def plot(runs: Sequence[Run], key: str, path: str | Path, x: str = "step") -> Path | None:
    """One PNG of ``key`` against x: per arm, its seeds thin and their mean thick. Curves of
    20 points or more are drawn EMA-smoothed (`sparring.report`). None when no run logged it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    drawn, smoothed = False, False
    arms = list(dict.fromkeys(r.arm for r in runs))
    for i, arm in enumerate(arms):
        cs = [curve(r.dir, key, x) for r in runs if r.arm == arm]
        cs = [(xs, _smooth(ys) if len(ys) >= 20 else ys) for xs, ys in cs if xs]
        if not cs:
            continue
        smoothed |= any(len(c[1]) >= 20 for c in cs)
        color = f"C{i % 10}"
        for xs, ys in cs:
            ax.plot(xs, ys, color=color, lw=0.7, alpha=0.35)
        mx, my = _mean_curve(cs)
        ax.plot(mx, my, color=color, lw=2, label=f"{arm} (n={len(cs)})")
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    xlabel = {"step": "step", "episodes": "episodes seen",
              "time": "training seconds (rollout + update)"}[x]
    ax.set_xlabel(xlabel)
    ax.set_title(key + (" (EMA-smoothed)" if smoothed else ""), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_name(key: str, x: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", key).strip("_") + f"__{x}.png"


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
        failed = run_jobs([r.job() for r in mine], args.jobs)
        if after is not None:
            failed += run_jobs(after([r for r in mine if r.complete()], args), args.jobs)
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
