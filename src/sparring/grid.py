"""A grid of ``sparring train`` runs (arm x seed) as subprocesses, and reading them back.

`plan` lays out the runs: run (arm, seed) trains in ``OUT/<arm>/seed<S>/`` as
``python -m sparring train RECIPE OVERRIDES... train.steps=N train.seed=S train.run_dir=DIR``,
its output in ``OUT/<arm>/seed<S>.log``. The grid creates ``DIR`` itself, with the run
marker (`sparring.train.runlock.RUN_MARKER`) and ``DIR/study.json``, which records the run's
arguments from the start and its exit status and wall seconds at the end. `run_jobs` runs
them ``n`` at a time, each on ``threads`` torch threads, as children that end with the
grid's process (`sparring.lifeline`: a killed grid leaves no trainer behind).

What an existing ``DIR`` gets (`folder_state`, checked for every run before any runs):

    no study.json                  refused: the grid did not make it; left as it is
    other arguments in study.json  refused, naming what differs; nothing is deleted
    its run.lock held              refused: a run is training there
    same arguments, finished       reused (its metrics.jsonl reaches step N)
    same arguments, unfinished     deleted and started again (this grid's own earlier
                                   attempt, killed or failed)

A refusal is a `FolderError`, one line naming the folder. `curve`, `last`, `wall_time` read
a run folder; `plot` draws a metric over a grid's seeds.

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
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparring.lifeline import child_env
from sparring.report.plots import _smooth, series
from sparring.storage.bounded import read_json_bounded
from sparring.storage.metrics_file import read_metrics
from sparring.train.runlock import lock_holder, write_run_marker

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
    return read_json_bounded(path, what="study record") if path.exists() else None


def is_complete(run_dir: str | Path, steps: int, args: Sequence[str] | None = None) -> bool:
    """The run's metrics reach step ``steps``, and (given ``args``) its record holds
    exactly ``args`` (a run without a record matches no arguments)."""
    last = final_step(run_dir)
    if last is None or last < steps:
        return False
    if args is None:
        return True
    try:
        rec = record(run_dir)
    except (OSError, ValueError):
        return False
    return isinstance(rec, dict) and rec.get("args") == list(args)


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


class FolderError(ValueError):
    """A run folder the grid may not use or delete; the message is one line naming it."""


def args_difference(stored: Sequence[str], asked: Sequence[str]) -> str:
    """What differs between two argument lists, in words."""
    only_stored = [a for a in stored if a not in asked]
    only_asked = [a for a in asked if a not in stored]
    if not only_stored and not only_asked:
        return "the same arguments in another order"
    parts = []
    if only_stored:
        parts.append(f"it has {' '.join(only_stored)}")
    if only_asked:
        parts.append(f"this run asks {' '.join(only_asked)}")
    return ", ".join(parts)


def folder_state(run: Run) -> str:
    """What to do with ``run``'s folder (module doc): "new", "done" (reuse) or "again"
    (delete and start again); a `FolderError` for a folder to leave alone."""
    d = run.dir
    if not os.path.lexists(d):
        return "new"
    if not d.is_dir() or d.is_symlink():
        raise FolderError(f"{d} exists and is not a run folder; it is left as it is: move it "
                          "away or pick another --out")
    if not (d / RECORD).is_file():
        raise FolderError(f"{d} was not made by a sweep (no {RECORD}); it is left as it is: "
                          "move it away or pick another --out")
    try:
        rec = record(d)
        stored = rec["args"]
        if not isinstance(stored, list):
            raise TypeError
    except (OSError, ValueError, TypeError, KeyError):
        raise FolderError(f"{d / RECORD} is damaged (no argument list); the folder is left as "
                          "it is: move it away or pick another --out") from None
    if stored != list(run.args):
        why = args_difference(stored, run.args)
        raise FolderError(f"{d} holds a run with other arguments ({why}); nothing was "
                          "deleted: pick another --out, or remove that folder yourself")
    holder = lock_holder(d)
    if holder is not None:
        raise FolderError(f"{d} is in use by a training run (pid {holder}); wait for it to "
                          "finish, or pick another --out")
    return "done" if is_complete(d, run.steps, run.args) else "again"


def _create(run: Run) -> None:
    """``run.dir`` made whole or not at all: a fresh hidden sibling gets the run marker and
    the record (no exit status yet), then takes the folder's name."""
    run.dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = run.dir.parent / f".{run.dir.name}.new-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()  # a fresh name, the umask's mode
    try:
        write_run_marker(tmp)
        _write_record(tmp, run, None, None)
        os.rename(tmp, run.dir)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)  # our own fresh folder
        raise FolderError(f"{run.dir}: cannot create it ({e.strerror or e})") from None


def _write_record(folder: Path, run: Run, rc: int | None, wall: float | None) -> None:
    from sparring.storage.atomic import atomic_write_text

    atomic_write_text(folder / RECORD, json.dumps(
        {"arm": run.arm, "seed": run.seed, "args": list(run.args), "returncode": rc,
         "wall_s": wall}, indent=1))


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
        def check() -> None:
            folder_state(self)

        def before() -> None:  # decided again now: a run may have started meanwhile
            state = folder_state(self)
            if state == "again":  # this grid's own run with these arguments, unfinished
                shutil.rmtree(self.dir)
            if state != "done":
                _create(self)

        def after(rc: int, wall: float) -> None:
            if self.dir.is_dir() and (self.dir / RECORD).is_file():
                _write_record(self.dir, self, rc, wall)

        cmd = [sys.executable, "-m", "sparring", "train", *self.args,
               f"train.run_dir={self.dir}"]
        return Job(f"{self.arm} seed {self.seed}", cmd, self.log, self.complete, before, after,
                   check)


@dataclass
class Job:
    """A command to run unless ``done()``; ``check`` runs for every job before any runs (a
    `FolderError` stops them all), ``before`` just before this one runs (a `FolderError`
    there fails this job alone), ``after(rc, wall_s)`` once it ended."""

    name: str
    cmd: list[str]
    log: Path
    done: Callable[[], bool]
    before: Callable[[], None] = field(default=lambda: None)
    after: Callable[[int, float], None] = field(default=lambda rc, wall: None)
    check: Callable[[], None] = field(default=lambda: None)


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
    the current folder) on ``threads`` threads with its stdout and stderr in its log,
    ending with this process (`sparring.lifeline`); returns the names of those that failed.
    Every job's ``check`` runs first: the first `FolderError` (with how many more there
    are) stops everything before anything runs or is deleted."""
    problems: list[FolderError] = []
    for j in jobs:
        try:
            j.check()
        except FolderError as e:
            problems.append(e)
    if problems:
        more = f" (and {len(problems) - 1} more folder(s))" if len(problems) > 1 else ""
        raise FolderError(f"{problems[0]}{more}")
    todo = [j for j in jobs if not j.done()]
    if len(todo) < len(jobs):
        print(f"{len(jobs) - len(todo)} of {len(jobs)} already done, reused", flush=True)
    env, failed = child_env(run_env(threads)), []

    def one(job: Job) -> tuple[Job, int | str, float]:
        try:
            job.before()
        except FolderError as e:
            return job, f"not run: {e}", 0.0
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
            state = ("ok" if rc == 0 else rc if isinstance(rc, str)
                     else f"FAILED (exit {rc}), see {job.log}")
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
    20 points or more are drawn EMA-smoothed (`sparring.report.plots`). None when no run logged it."""
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
