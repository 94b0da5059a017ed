"""What `train.minibatch_order: prompt` saves in a recipe's update, against `rows`, on the
same batches from the same weights.

    PYTHONPATH=src python bench/minibatch_order.py                       # default, 50 steps
    PYTHONPATH=src python bench/minibatch_order.py default train.share_rows=false
    PYTHONPATH=src python bench/minibatch_order.py smollm2_tictactoe_top --steps 3

Trains the recipe for a few steps (no evaluation, no checkpoints) in the order it sets. At
every update, the learner's state and the weights are kept, the update is run and timed in
the other order, everything is put back, and the update the run keeps is run and timed in
the recipe's own order: both orders meet every batch from the same start. Prints the
update seconds a step of each order and their ratio, prompt / rows. Threads: torch's
default, or OMP_NUM_THREADS. Run it alone.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

from sparring.assembly import build
from sparring.config import find_recipe, load_config
from sparring.train.learner import Learner
from sparring.train.loop import train

ORDERS = ("rows", "prompt")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", nargs="?", default="default", help="recipe name or YAML path")
    ap.add_argument("overrides", nargs="*", help="config overrides, key=value")
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_intermixed_args()
    cfg = load_config(find_recipe(args.recipe), [
        *args.overrides, f"train.steps={args.steps}", "eval.at_start=false", "eval.every=0",
        "logging.progress=false", "checkpoint.every=0"])
    own = cfg.train.minibatch_order
    seconds = dict.fromkeys(ORDERS, 0.0)
    update = Learner.update

    def both_orders(learner: Learner, *a, **k):
        kept = copy.deepcopy(learner.state_dict())
        weights = copy.deepcopy(learner.model.state_dict())
        other = ORDERS[1 - ORDERS.index(own)]
        learner.cfg.train.minibatch_order = other
        t = time.perf_counter()
        update(learner, *a, **k)
        seconds[other] += time.perf_counter() - t
        learner.cfg.train.minibatch_order = own
        learner.model.load_state_dict(weights)
        learner.load_state_dict(kept)
        t = time.perf_counter()
        out = update(learner, *a, **k)
        seconds[own] += time.perf_counter() - t
        return out

    Learner.update = both_orders
    folder = Path(tempfile.mkdtemp(prefix="sparring-minibatch-order-"))
    parts = build(cfg, folder)
    train(cfg, parts.model, parts.rollout_fn, None, parts.stateful, run_dir=folder / "run",
          pad_id=parts.pad_id)
    print(f"{args.recipe} {' '.join(args.overrides)}: {args.steps} updates, each run in both "
          f"orders from the same weights (the run follows {own!r})")
    print("| order | update s/step |")
    print("|---|---|")
    for order in ORDERS:
        print(f"| {order} | {seconds[order] / args.steps:.3f} |")
    print(f"update, prompt / rows: {seconds['prompt'] / seconds['rows']:.3f}")


if __name__ == "__main__":
    main()
