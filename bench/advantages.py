"""Advantage computation against one learner step, on a shipped recipe's batch.

DESIGN.md: a fast path for an estimator needs advantage computation above ~2% of a
training step. This prints that share for every registered estimator. It runs one
rollout step of a recipe with its tiny model (default configs/mixed_games.yaml: 256
episodes a step in groups of 16, up to 9 turns; the largest batch of the shipped
tiny-model recipes, about 1,100 turn rows x 80 tokens), times one `Learner.update` of the
recipe on that batch, then each estimator through `sparring.advantages.compute` on the same
batch (best of ``--repeat``). Fields the rollout does not fill (critic values, the
per-turn extras of igpo, matchtir, remax and archer_targets) get random numbers.

    PYTHONPATH=src python bench/advantages.py
    PYTHONPATH=src python bench/advantages.py --config configs/kuhn_selfplay.yaml
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from sparring.advantages import ESTIMATORS, compute, list_estimators
from sparring.assembly.run import build
from sparring.config import load_config
from sparring.data import TurnBatch, collate
from sparring.train.learner import Learner

EXTRAS = ("p_before", "p_after", "match", "q1", "q2", "v1", "v2", "greedy_reward")


def with_every_field(batch: TurnBatch, seed: int = 0) -> TurnBatch:
    """Random critic values and per-turn extras where the rollout has none."""
    g = torch.Generator().manual_seed(seed)
    extras = {k: torch.rand(batch.n_rows, generator=g) for k in EXTRAS} | batch.extras
    values = torch.randn(batch.action_mask.shape, generator=g) * batch.action_mask
    return batch.with_fields(values=values, extras=extras)


def best_time(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/mixed_games.yaml")
    ap.add_argument("--repeat", type=int, default=5, help="best of N per estimator")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = load_config(a.config)
    with tempfile.TemporaryDirectory() as run_dir:
        parts = build(cfg, run_dir=run_dir)
        episodes = list(parts.rollout_fn(0))
    batch = with_every_field(collate(episodes, layout="turn", pad_id=parts.pad_id))
    learner = Learner(parts.model, cfg)
    adv, keep = compute(cfg.algorithm.estimator, batch, **cfg.algorithm.estimator_options)
    t0 = time.perf_counter()
    learner.update(batch, adv, keep)
    step = time.perf_counter() - t0
    print(f"{a.config}: {len(episodes)} episodes -> {batch.n_rows} rows x "
          f"{batch.action_mask.shape[1]} tokens; torch {torch.__version__}, {a.threads} threads")
    print(f"one Learner.update ({cfg.train.epochs} epoch(s), objective {cfg.algorithm.objective}): "
          f"{step:.3f} s")
    print(f"{'estimator':24} {'family':8} {'ms':>8} {'% of update':>12}")
    for e in list_estimators():
        state = ESTIMATORS.get(e.name).extra.get("state")
        opts = {"state": state()} if state is not None else {}
        try:
            sec = best_time(lambda n=e.name, o=opts: compute(n, batch, **o), a.repeat)
        except ValueError as exc:  # e.g. bnpo on returns outside [0, 1]
            print(f"{e.name:24} {e.family:8} skipped: {exc}")
            continue
        print(f"{e.name:24} {e.family:8} {sec * 1e3:8.2f} {100 * sec / step:11.2f}%")


if __name__ == "__main__":
    main()
