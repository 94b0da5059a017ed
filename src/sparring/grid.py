"""A grid of ``sparring train`` runs (arm x seed) as subprocesses, and reading them back.

`plan` lays out the runs: run (arm, seed) trains in ``OUT/<arm>/seed<S>/`` as
``python -m sparring train RECIPE OVERRIDES... train.steps=N train.seed=S train.run_dir=DIR``,
its output in ``OUT/<arm>/seed<S>.log``, and ``DIR/study.json`` records its arguments, exit
status and wall seconds. `run_jobs` runs them ``n`` at a time, each on ``threads`` torch
threads; a run whose ``metrics.jsonl`` already reaches step N with the same arguments is
reused, so an interrupted grid resumes where it stopped, and an incomplete one starts again.
`curve`, `last`, `wall_time` read a run folder; `plot` draws a metric over a grid's seeds.

Used by ``sparring sweep`` (`sparring.sweep`: one recipe over seeds) and by the studies
(studies/runner.py: several arms, their t intervals).
"""

from __future__ import annotations

import json
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

from sparring.report import _smooth, series
from sparring.train.metrics import read_metrics

RECORD = "study.json"
_SRC = Path(__file__).resolve().parents[1]  # the folder holding the sparring package


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


def run_env(threads: int = 1) -> dict[str, str]:
    """The runs' environment: ``threads`` OpenMP/MKL threads, and this sparring importable
    (also from a checkout that was not installed)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_SRC), env.get("PYTHONPATH")) if p)
    return env


def run_jobs(jobs: Sequence[Job], n: int = 1, threads: int = 1,
             cwd: str | Path | None = None) -> list[str]:
    """Run the jobs not yet done, ``n`` at a time, each as a subprocess (in ``cwd``, default
    the current folder) on ``threads`` threads with its stdout and stderr in its log;
    returns the names of those that failed."""
    todo = [j for j in jobs if not j.done()]
    if len(todo) < len(jobs):
        print(f"{len(jobs) - len(todo)} of {len(jobs)} already done, reused", flush=True)
    env, failed = run_env(threads), []

    def one(job: Job) -> tuple[Job, int, float]:
        job.before()
        job.log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(job.log, "w") as log:
            rc = subprocess.run(job.cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
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
