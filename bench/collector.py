"""What keeping the startup objects out of the garbage collector saves a run
(`sparring.train.collector`).

    PYTHONPATH=src python bench/collector.py                      # default recipe, 250 steps, 2 runs an arm
    PYTHONPATH=src python bench/collector.py --steps 60 --repeats 3

Runs the recipe (no evaluation, no checkpoints) as `train` does, the objects alive at its
start frozen (`frozen`), and with that switched off, the collector as Python leaves it
(`plain`), alternating, each run in its own process with ``OMP_NUM_THREADS=--threads``.
For each arm: the seconds of the training steps (the loop's ``time/rollout +
time/update``, summed over the run), the seconds the collector ran in them
(``gc.callbacks``), its collections of each generation, and whether the two arms' metrics
agree to the last bit. Its last line reads ``frozen / plain steps: N.NNx`` (medians over the
runs). Run it alone: two jobs on two cores slow each other several times over.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from determinism import first_parting


def child(recipe: str, overrides: list[str], steps: int, frozen: bool, folder: Path) -> None:
    """One run in this process; its collector figures to ``folder/collector.json``."""
    from sparring.assembly import build
    from sparring.config import find_recipe, load_config
    from sparring.train import loop

    if not frozen:
        loop.startup_objects_frozen = contextlib.nullcontext
    cfg = load_config(find_recipe(recipe), [
        *overrides, f"train.steps={steps}", "eval.at_start=false", "eval.every=0",
        "logging.progress=false", "checkpoint.every=0"])
    parts = build(cfg, folder)
    spent = {"seconds": 0.0, "collections": [0, 0, 0]}
    started = [0.0]

    def clock(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent["seconds"] += time.perf_counter() - started[0]
            spent["collections"][info["generation"]] += 1

    gc.callbacks.append(clock)
    loop.train(cfg, parts.model, parts.rollout_fn, None, parts.stateful,
               run_dir=folder / "run", pad_id=parts.pad_id)
    gc.callbacks.remove(clock)
    (folder / "collector.json").write_text(json.dumps(spent))


def run_once(args: argparse.Namespace, frozen: bool, folder: Path) -> tuple[list[dict], dict]:
    """One run in a fresh process: its metrics rows and collector figures."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(
        [sys.executable, __file__, args.recipe, *args.overrides, "--steps", str(args.steps),
         "--child", "frozen" if frozen else "plain", "--folder", str(folder)],
        env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the run in {folder} failed:\n{done.stderr[-4000:]}")
    rows = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    return rows, json.loads((folder / "collector.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", nargs="?", default="default")
    ap.add_argument("overrides", nargs="*", help="config overrides, key=value")
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--child", choices=["frozen", "plain"], help=argparse.SUPPRESS)
    ap.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_intermixed_args()
    if args.child:
        child(args.recipe, args.overrides, args.steps, args.child == "frozen", args.folder)
        return
    root = Path(tempfile.mkdtemp(prefix="sparring-collector-"))
    runs: dict[bool, list[tuple[list[dict], dict]]] = {True: [], False: []}
    for i in range(args.repeats):
        for frozen in (False, True):
            folder = root / f"{'frozen' if frozen else 'plain'}{i}"
            runs[frozen].append(run_once(args, frozen, folder))
    print(f"{args.recipe}, {args.steps} steps, {args.threads} threads, "
          f"{args.repeats} runs an arm")
    seconds = {}
    for frozen, arm in runs.items():
        steps = [sum(r["time/rollout"] + r["time/update"] for r in rows if "time/update" in r)
                 for rows, _ in arm]
        seconds[frozen] = statistics.median(steps)
        collector = ", ".join(f"{c['seconds']:.1f} s ({'/'.join(map(str, c['collections']))})"
                              for _, c in arm)
        print(f"  {'frozen' if frozen else 'plain':6}  steps {seconds[frozen]:.1f} s "
              f"(runs: {', '.join(f'{s:.1f}' for s in steps)})  collector: {collector}")
    part = first_parting([rows for arm in runs.values() for rows, _ in arm])
    print("  metrics of all runs " + ("agree to the last bit" if part is None
                                      else f"part at step {part}"))
    print(f"frozen / plain steps: {seconds[True] / seconds[False]:.2f}x")


if __name__ == "__main__":
    main()
