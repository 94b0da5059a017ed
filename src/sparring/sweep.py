"""``sparring sweep RECIPE --seeds 0-7 --jobs 2 [overrides]``: one recipe over seeds.

Each seed trains as its own ``sparring train`` subprocess in ``OUT/seed<S>/``, which ends
with the sweep however the sweep is killed (`sparring.lifeline`). The sweep deletes or
overwrites only what it made, and refuses with one line, before anything runs, rather than
guess (`claim_out`, `sparring.grid.folder_state`):

* ``OUT`` carries ``sweep.json``, written when the sweep creates it; an existing ``OUT``
  without it is used only when empty (or when it holds nothing but an older sweep's
  files), and ``OUT/sweep.lock`` keeps a second sweep out of it while one runs.
* a seed folder carries ``study.json`` with the run's arguments from its creation: with
  the same arguments it is reused when finished and started again when not (the sweep's
  own earlier attempt); with other arguments, without the record, or while its run.lock
  is held (a live trainer) the sweep stops naming it, and deletes nothing.

Then, per metric, the
seeds' final value and best value (the best of its evaluations: lowest for a ``min``
metric such as exploitability, highest for a ``max`` one such as a non-loss rate) are
summarised across seeds:

    median                      the middle seed (mean of the two middle ones for even n)
    IQM                         interquartile mean: the mean of the middle half,
                                scipy.stats.trim_mean(x, 0.25) (rliable's IQM)
    worst                       min for a max metric, max for a min metric
    reached                     seeds at or past the metric's target, when it has one

with 95% percentile-bootstrap intervals for the median and the IQM
(scipy.stats.bootstrap, 2000 resamples of the seeds, a fixed generator so a table
reprints the same). The table goes to stdout and ``OUT/sweep.md``, the curves (each seed
thin, their median thick) to ``OUT/sweep.png``.

A metric is named ``KEY``, ``KEY:min`` / ``KEY:max``, or with a target ``KEY>=0.95`` /
``KEY<=0.05`` (which also sets its direction). Without ``--metric``: every evaluation key
of the runs' last row that is a headline figure (`HEADLINES`), exploitability minimised,
the others maximised.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import numpy as np

from sparring.grid import RECORD, Arm, Run, plan, rows, run_jobs, wall_time
from sparring.report.plots import series

HEADLINES = ("/exploitability", "/non_loss", "/joint/mean_return_seat0")
MAX_SEEDS = 1000  # seeds in one sweep
MAX_JOBS = 64  # runs at a time
MAX_SEED = 2**32 - 1  # train.seed's range
_SPEC = re.compile(r"^(?P<key>[^:<>=]+?)(?::(?P<mode>min|max)|(?P<op><=|>=)(?P<target>.+))?$")


SWEEP_MARKER = "sweep.json"
SWEEP_LOCK = "sweep.lock"
_SWEEP_FILES = re.compile(r"^(seed\d+\.log|sweep\.(md|png|lock))$")


class SweepError(ValueError):
    """A bad sweep argument: the message names it."""


def _sweeps_own(p: Path) -> bool:
    """Whether ``p`` (in an output folder without `SWEEP_MARKER`) is what a sweep writes."""
    if p.is_dir() and not p.is_symlink():
        return re.fullmatch(r"seed\d+", p.name) is not None and (p / RECORD).is_file()
    return p.is_file() and _SWEEP_FILES.match(p.name) is not None


def claim_out(out: Path, recipe: str, overrides: Sequence[str]) -> None:
    """Make ``out`` this sweep's folder: create it with `SWEEP_MARKER`, or take one that has
    it; an existing folder without it only when it is empty or holds nothing but an older
    sweep's files (seed folders with their ``study.json``, logs, ``sweep.md``/``.png``).
    A `SweepError` naming the folder otherwise, with nothing written."""
    if os.path.lexists(out) and not out.is_dir():
        raise SweepError(f"--out: {out} exists and is not a folder; pick another --out")
    if out.is_dir() and not (out / SWEEP_MARKER).is_file():
        foreign = [p.name for p in sorted(out.iterdir()) if not _sweeps_own(p)]
        if foreign:
            raise SweepError(f"--out: {out} holds files no sweep wrote (such as "
                             f"{foreign[0]!r}) and no {SWEEP_MARKER}; nothing was written or "
                             "deleted: pick another --out")
    out.mkdir(parents=True, exist_ok=True)
    if not (out / SWEEP_MARKER).is_file():
        from sparring.storage.atomic import atomic_write_text

        atomic_write_text(out / SWEEP_MARKER, json.dumps(
            {"format": 1, "kind": "sweep", "recipe": recipe, "overrides": list(overrides),
             "created": datetime.now().isoformat(timespec="seconds")}, indent=1) + "\n")


def parse_seeds(text: str) -> list[int]:
    """``"0-7"`` -> 0..7, ``"0,2,5"``, ``"0-3,8"``; distinct, in the order given; at most
    `MAX_SEEDS` of them, each in train.seed's range [0, `MAX_SEED`]."""
    seeds: dict[int, None] = {}
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise SweepError(f"--seeds: {part!r} is not a seed or a range (e.g. 0-7 or 0,2,5)")
        lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
        if hi < lo:
            raise SweepError(f"--seeds: the range {part!r} is empty (write low-high, e.g. 0-7)")
        if hi > MAX_SEED:
            raise SweepError(f"--seeds: {hi} is out of range (a seed is at most {MAX_SEED}, "
                             "as train.seed)")
        if hi - lo + 1 > MAX_SEEDS:
            raise SweepError(f"--seeds: {part!r} holds {hi - lo + 1} seeds, more than "
                             f"{MAX_SEEDS}")
        seeds.update(dict.fromkeys(range(lo, hi + 1)))
        if len(seeds) > MAX_SEEDS:
            raise SweepError(f"--seeds: {text!r} holds more than {MAX_SEEDS} seeds")
    return list(seeds)


@dataclass(frozen=True)
class Metric:
    """A logged key, whether lower or higher is better, and an optional target."""

    key: str
    mode: str = "max"  # "min" | "max"
    target: float | None = None

    def better(self, a: float, b: float) -> bool:
        return a < b if self.mode == "min" else a > b

    def reaches(self, x: float) -> bool:
        return x <= self.target if self.mode == "min" else x >= self.target

    @property
    def label(self) -> str:
        if self.target is None:
            return f"{self.key} ({'lower' if self.mode == 'min' else 'higher'} is better)"
        return f"{self.key} {'<=' if self.mode == 'min' else '>='} {self.target:g}"


def parse_metric(spec: str) -> Metric:
    m = _SPEC.match(spec.strip())
    if not m:
        raise SweepError(f"--metric: {spec!r} is not KEY, KEY:min, KEY:max, KEY>=X or KEY<=X")
    key = m["key"].strip()
    if m["op"]:
        try:
            target = float(m["target"])
        except ValueError:
            raise SweepError(f"--metric: the target of {spec!r} is not a number") from None
        return Metric(key, "min" if m["op"] == "<=" else "max", target)
    return Metric(key, m["mode"] or default_mode(key))


def default_mode(key: str) -> str:
    return "min" if "exploitability" in key else "max"


def headline_metrics(runs: Sequence[Run]) -> list[Metric]:
    """The headline evaluation keys the runs logged (`HEADLINES`), in their logged order."""
    keys: dict[str, None] = {}
    for r in runs:
        for row in rows(r.dir):
            keys.update((k, None) for k in row if k.startswith("eval/")
                        and k.endswith(HEADLINES) and not k.endswith("_average"))
    return [Metric(k, default_mode(k)) for k in keys]


# ---------------------------------------------------------------- statistics


def iqm(x: Sequence[float]) -> float:
    """Interquartile mean: the mean of the middle half (25% trimmed from each end)."""
    from scipy.stats import trim_mean

    return float(trim_mean(np.asarray(x, dtype=float), 0.25))


def bootstrap_interval(x: Sequence[float], statistic, seed: int = 0,
                       resamples: int = 2000) -> tuple[float, float]:
    """95% percentile-bootstrap interval of ``statistic`` over the seeds ``x`` (nan for fewer
    than 2 seeds; a single point when they all agree)."""
    x = np.asarray(x, dtype=float)
    if len(x) < 2:
        return math.nan, math.nan
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    from scipy.stats import bootstrap

    res = bootstrap((x,), lambda s, axis=-1: np.apply_along_axis(statistic, axis, s),
                    n_resamples=resamples, method="percentile", vectorized=True,
                    rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


@dataclass
class Summary:
    """One row of the table: ``what`` (final or best) of a metric over n seeds."""

    metric: Metric
    what: str
    values: dict[int, float]  # seed -> value
    median: float
    median_ci: tuple[float, float]
    iqm: float
    iqm_ci: tuple[float, float]
    worst: float
    reached: int | None


def summarise(metric: Metric, what: str, values: dict[int, float]) -> Summary:
    x = list(values.values())
    worst = (max(x) if metric.mode == "min" else min(x)) if x else math.nan
    return Summary(metric, what, values, float(np.median(x)) if x else math.nan,
                   bootstrap_interval(x, np.median), iqm(x) if x else math.nan,
                   bootstrap_interval(x, iqm), worst,
                   None if metric.target is None else sum(metric.reaches(v) for v in x))


def seed_values(runs: Sequence[Run], metric: Metric) -> tuple[dict[int, float], dict[int, float]]:
    """Per seed, the metric's last logged value and its best one (seeds that never logged
    it are left out)."""
    final, best = {}, {}
    for r in runs:
        _, ys = series(rows(r.dir), metric.key)
        ys = [y for y in ys if y is not None and math.isfinite(y)]
        if ys:
            final[r.seed] = ys[-1]
            best[r.seed] = min(ys) if metric.mode == "min" else max(ys)
    return final, best


def _f(v: float) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.3f}"


def _ci(ci: tuple[float, float]) -> str:
    return "-" if not math.isfinite(ci[0]) else f"[{_f(ci[0])}, {_f(ci[1])}]"


def table(summaries: Sequence[Summary]) -> str:
    """Markdown: one row per (metric, final|best)."""
    out = ["| metric | | n | median [95% CI] | IQM [95% CI] | worst | reached | per seed |",
           "|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        reached = "-" if s.reached is None else f"{s.reached}/{len(s.values)}"
        seeds = ", ".join(f"{k}: {_f(v)}" for k, v in sorted(s.values.items()))
        out.append(f"| {s.metric.label} | {s.what} | {len(s.values)} | {_f(s.median)} "
                   f"{_ci(s.median_ci)} | {_f(s.iqm)} {_ci(s.iqm_ci)} | {_f(s.worst)} | "
                   f"{reached} | {seeds} |")
    return "\n".join(out)


def plot_seeds(runs: Sequence[Run], metrics: Sequence[Metric], path: Path) -> Path | None:
    """One panel per metric: each seed's curve (thin) and the median over seeds (thick)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {m.key: [series(rows(r.dir), m.key) for r in runs] for m in metrics}
    shown = [m for m in metrics if any(xs for xs, _ in curves[m.key])]
    if not shown:
        return None
    fig, axes = plt.subplots(len(shown), 1, figsize=(6.4, 3.0 * len(shown)), squeeze=False)
    for ax, m in zip(axes[:, 0], shown):
        by_step: dict[int, list[float]] = {}
        for r, (xs, ys) in zip(runs, curves[m.key]):
            if xs:
                ax.plot(xs, ys, lw=0.8, alpha=0.45, label=f"seed {r.seed}")
            for x, y in zip(xs, ys):
                by_step.setdefault(x, []).append(y)
        steps = sorted(by_step)
        ax.plot(steps, [float(np.median(by_step[s])) for s in steps], color="black", lw=2.2,
                label="median")
        if m.target is not None:
            ax.axhline(m.target, color="grey", ls="--", lw=1)
        ax.set_title(m.label, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7, ncol=4)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- the command


def sweep(recipe: str, seeds: Sequence[int], overrides: Sequence[str] = (), *, jobs: int = 1,
          threads: int | None = None, out: str | Path | None = None,
          metrics: Sequence[str] = (), steps: int | None = None) -> tuple[str, int]:
    """Run ``recipe`` (with ``overrides``) once per seed, ``jobs`` at a time on ``threads``
    torch threads each (default: the cores shared among the jobs); (the markdown report,
    the number of failed runs). ``steps``: train.steps of every run (default: the recipe's)."""
    from sparring.config import find_recipe, load_config
    from sparring.train.runlock import RunLock

    if not 1 <= jobs <= MAX_JOBS:
        raise SweepError(f"--jobs: {jobs}; must be in [1, {MAX_JOBS}]")
    specs = [parse_metric(m) for m in metrics]
    cfg = load_config(find_recipe(recipe), list(overrides))  # a bad recipe fails here, once
    n_steps = steps or cfg.train.steps
    threads = threads or max(1, (os.cpu_count() or 1) // jobs)
    name = Path(recipe).stem
    out = Path(out) if out else Path("runs") / "sweeps" / \
        f"{name}-{datetime.now():%Y%m%d-%H%M%S}"
    out = out.resolve()
    # one arm: its seeds directly under OUT, not under OUT/<arm>
    runs = [replace(r, dir=out / f"seed{r.seed}")
            for r in plan({name: Arm(recipe, list(overrides))}, seeds, out, n_steps)]
    claim_out(out, recipe, overrides)
    with RunLock(out, SWEEP_LOCK, "--out: {folder} is in use by another sweep (pid {pid}); "
                 "wait for it to finish, or pick another --out"):
        print(f"sweep {name}: seeds {', '.join(map(str, seeds))}, {jobs} at a time, "
              f"{threads} thread(s) each -> {out}", flush=True)
        failed = run_jobs([r.job() for r in runs], jobs, threads=threads)
        return _report(name, recipe, seeds, overrides, runs, failed, out, jobs, threads,
                       metrics, specs, steps)


def _report(name: str, recipe: str, seeds: Sequence[int], overrides: Sequence[str],
            runs: list[Run], failed: list[str], out: Path, jobs: int, threads: int,
            metrics: Sequence[str], specs: list[Metric], steps: int | None) -> tuple[str, int]:
    """The sweep's table (stdout, ``OUT/sweep.md``) and plot (``OUT/sweep.png``)."""
    chosen = specs or headline_metrics(runs)
    summaries = []
    for m in chosen:
        final, best = seed_values(runs, m)
        if final:
            summaries += [summarise(m, "final", final), summarise(m, "best", best)]
    walls = [w for r in runs if (w := wall_time(r.dir)) is not None]
    cmd = " ".join(["sparring sweep", recipe, "--seeds", ",".join(map(str, seeds)),
                    *([f"--steps {steps}"] if steps else []),
                    *[f"--metric '{m}'" for m in metrics], *overrides])
    md = [f"# Sweep of {name} over {len(seeds)} seeds", "", f"    {cmd}", "",
          table(summaries) if summaries else "no run logged any of the metrics", "",
          f"Final: the last evaluation of each seed; best: its best evaluation. Intervals: "
          f"95% percentile bootstrap over seeds (scipy.stats.bootstrap, 2000 resamples). "
          f"Wall time per run: median {_f(float(np.median(walls)) / 60) if walls else '-'} "
          f"min ({jobs} run(s) at a time, {threads} thread(s) each)."]
    if failed:
        md += ["", f"Failed: {', '.join(failed)} (see their .log files in {out})."]
    pic = plot_seeds(runs, chosen, out / "sweep.png")
    if pic:
        md += ["", "![the seeds' curves](sweep.png)"]
    text = "\n".join(md) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.md").write_text(text)
    return text, len(failed)
