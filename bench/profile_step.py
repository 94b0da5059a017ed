"""Where a training step of a shipped recipe spends its time (cProfile over `train`).

    PYTHONPATH=src python bench/profile_step.py                      # configs/default.yaml, 8 steps
    PYTHONPATH=src python bench/profile_step.py leduc_selfplay --steps 4 --top 20
    PYTHONPATH=src python bench/profile_step.py default --sort tottime   # time in each function alone
    PYTHONPATH=src python bench/profile_step.py default rollout.episodes_per_step=128

Runs the recipe for a few steps (no evaluation, no checkpoints) in a temporary folder and
prints the rollout and update seconds per step (the loop's own `time/rollout` and
`time/update`, so the profiler's overhead is in both alike) and the functions with the
largest cumulative time. Threads: torch's default, or OMP_NUM_THREADS.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import tempfile
from pathlib import Path

from sparring.assembly import build
from sparring.config import find_recipe, load_config
from sparring.train.loop import train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", nargs="?", default="default", help="recipe name or YAML path")
    ap.add_argument("overrides", nargs="*", help="config overrides, key=value")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--top", type=int, default=30, help="rows of the profile to print")
    ap.add_argument("--sort", default="cumulative", choices=["cumulative", "tottime"],
                    help="order of the rows: time in and under a function, or in it alone")
    args = ap.parse_intermixed_args()
    cfg = load_config(find_recipe(args.recipe), [
        *args.overrides, f"train.steps={args.steps}", "eval.at_start=false", "eval.every=0",
        "logging.progress=false", "checkpoint.every=0"])
    folder = Path(tempfile.mkdtemp(prefix="sparring-profile-"))
    parts = build(cfg, folder)
    profile = cProfile.Profile()
    profile.enable()
    train(cfg, parts.model, parts.rollout_fn, None, parts.stateful, run_dir=folder / "run",
          pad_id=parts.pad_id)
    profile.disable()
    lines = (folder / "run" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    n = len(rows)
    print(f"{args.recipe}, {n} steps: rollout {sum(r['time/rollout'] for r in rows) / n:.3f} "
          f"s a step, update {sum(r['time/update'] for r in rows) / n:.3f} s a step")
    pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
