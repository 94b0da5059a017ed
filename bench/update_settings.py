"""What a setting of the update saves in a recipe, against another, on the same batches from
the same weights.

    PYTHONPATH=src python bench/update_settings.py default --other train.minibatch_order=rows
    PYTHONPATH=src python bench/update_settings.py default train.share_rows=false \
        --other train.minibatch_order=rows
    PYTHONPATH=src python bench/update_settings.py negotiation_selfplay --steps 10 \
        --other train.microbatch_tokens=0

Trains the recipe (with the positional overrides) for a few steps, no evaluation, no
checkpoints. At every update the learner's state and the weights are kept, the update is
run and timed with the ``--other`` settings, everything is put back, and the update the
run keeps is run and timed with the run's own settings: both meet every batch from the
same start. Prints the update seconds a step of each and their ratio, own / other. Only
settings the learner reads at each update apply (`train.minibatch_order`,
`train.share_rows`, `train.share_prefix`, `train.microbatch_size`,
`train.microbatch_tokens`). Threads: torch's default, or OMP_NUM_THREADS. Run it alone.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path
from typing import Any

from sparring.assembly import build
from sparring.config import find_recipe, load_config
from sparring.config.schema import from_dict, to_dict
from sparring.train.learner import Learner
from sparring.train.loop import train

READ_AT_UPDATE = ("minibatch_order", "share_rows", "share_prefix", "microbatch_size",
                  "microbatch_tokens")


def parse_other(pairs: list[str], cfg: Any) -> dict[str, Any]:
    """``train.KEY=VALUE`` pairs -> {KEY: value}, each value checked by the config's own
    parser (the run's config with the pairs applied)."""
    keys = []
    for pair in pairs:
        section, _, rest = pair.partition(".")
        key = rest.partition("=")[0]
        if section != "train" or key not in READ_AT_UPDATE:
            raise SystemExit(f"--other {pair}: one of train.{', train.'.join(READ_AT_UPDATE)}")
        keys.append(key)
    other = from_dict(to_dict(cfg), pairs)
    return {k: getattr(other.train, k) for k in keys}


def settings_text(settings: dict[str, Any]) -> str:
    return ", ".join(f"train.{k}={v}" for k, v in settings.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", nargs="?", default="default", help="recipe name or YAML path")
    ap.add_argument("overrides", nargs="*", help="config overrides of the run, key=value")
    ap.add_argument("--other", action="append", required=True,
                    help="a setting of the other update, train.KEY=VALUE (repeatable)")
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_intermixed_args()
    cfg = load_config(find_recipe(args.recipe), [
        *args.overrides, f"train.steps={args.steps}", "eval.at_start=false", "eval.every=0",
        "logging.progress=false", "checkpoint.every=0"])
    other = parse_other(args.other, cfg)
    own = {k: getattr(cfg.train, k) for k in other}
    seconds = {"own": 0.0, "other": 0.0}
    update = Learner.update

    def timed(learner: Learner, settings: dict[str, Any], arm: str, *a, **k):
        for key, value in settings.items():
            setattr(learner.cfg.train, key, value)
        t = time.perf_counter()
        out = update(learner, *a, **k)
        seconds[arm] += time.perf_counter() - t
        return out

    def both(learner: Learner, *a, **k):
        kept = copy.deepcopy(learner.state_dict())
        weights = copy.deepcopy(learner.model.state_dict())
        timed(learner, other, "other", *a, **k)
        learner.model.load_state_dict(weights)
        learner.load_state_dict(kept)
        return timed(learner, own, "own", *a, **k)

    Learner.update = both
    try:
        folder = Path(tempfile.mkdtemp(prefix="sparring-update-settings-"))
        parts = build(cfg, folder)
        train(cfg, parts.model, parts.rollout_fn, None, parts.stateful,
              run_dir=folder / "run", pad_id=parts.pad_id)
    finally:
        Learner.update = update
    print(f"{args.recipe} {' '.join(args.overrides)}: {args.steps} updates, each run with both "
          f"settings from the same weights (the run follows its own)")
    print("| settings | update s/step |")
    print("|---|---|")
    print(f"| own: {settings_text(own)} | {seconds['own'] / args.steps:.3f} |")
    print(f"| other: {settings_text(other)} | {seconds['other'] / args.steps:.3f} |")
    print(f"update, own / other: {seconds['own'] / seconds['other']:.3f}")


if __name__ == "__main__":
    main()
