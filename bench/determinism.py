"""Does ``train.deterministic`` make multi-threaded runs repeat bit for bit, and what does
it cost?

    PYTHONPATH=src python bench/determinism.py                       # default recipe, 60 steps, 2 threads
    PYTHONPATH=src python bench/determinism.py kuhn_selfplay --steps 40 --repeats 3

Runs the recipe ``--repeats`` times with the switch off and as often with it on, one run
at a time, alternating (off, on, off, on, ...), each in its own process with
``OMP_NUM_THREADS=--threads``, no evaluation before the end and no checkpoints. For each
arm it prints the seconds a step (the loop's ``time/rollout + time/update``, median over
its runs) and whether its runs' metrics agree to the last bit, or the first step where they
part. Its last line reads ``deterministic step time: N.NNx`` (on over off). Run it alone:
two jobs on two cores slow each other several times over.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from sparring.report.plots import TIMING


def run_once(recipe: str, steps: int, threads: int, deterministic: bool, folder: Path,
             overrides: list[str]) -> list[dict]:
    """One training run in a fresh process; its metrics rows."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(
        [sys.executable, "-m", "sparring.cli", "train", recipe, *overrides,
         f"train.steps={steps}", f"train.deterministic={str(deterministic).lower()}",
         "eval.at_start=false", "eval.every=0", "checkpoint.every=0",
         "logging.progress=false", f"train.run_dir={folder}"],
        env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the run in {folder} failed:\n{done.stderr[-4000:]}")
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def first_parting(runs: list[list[dict]]) -> int | None:
    """The first step whose non-timing metrics differ between any two runs (None: none)."""
    def fixed(row: dict) -> dict:
        return {k: v for k, v in row.items() if not k.startswith(TIMING)}
    for rows in zip(*runs, strict=True):
        if any(fixed(r) != fixed(rows[0]) for r in rows[1:]):
            return rows[0]["step"]
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", nargs="?", default="default")
    ap.add_argument("overrides", nargs="*", help="config overrides, key=value")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_intermixed_args()
    root = Path(tempfile.mkdtemp(prefix="sparring-determinism-"))
    runs: dict[bool, list[list[dict]]] = {False: [], True: []}
    for i in range(args.repeats):
        for det in (False, True):
            runs[det].append(run_once(args.recipe, args.steps, args.threads, det,
                                      root / f"{'on' if det else 'off'}{i}", args.overrides))
    seconds = {}
    print(f"{args.recipe}, {args.steps} steps, {args.threads} threads, {args.repeats} runs an arm")
    for det, arm in runs.items():
        per_run = [statistics.mean(r["time/rollout"] + r["time/update"] for r in rows
                                   if "time/update" in r) for rows in arm]
        seconds[det] = statistics.median(per_run)
        part = first_parting(arm)
        agree = "agree to the last bit" if part is None else f"part at step {part}"
        print(f"  deterministic={str(det).lower():5}  {seconds[det]:.3f} s a step  "
              f"(runs: {', '.join(f'{s:.3f}' for s in per_run)})  runs {agree}")
    print(f"deterministic step time: {seconds[True] / seconds[False]:.2f}x")


if __name__ == "__main__":
    main()
