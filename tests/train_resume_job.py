"""A short training run for the resume test; also runnable as a victim process:

    python -m tests.train_resume_job RUN_DIR --block-at STEP

blocks inside the rollout of step index STEP (after the earlier steps were logged and
checkpointed) until it is killed.

Every run of the job, in the test process or as a victim, trains on THREADS torch threads:
runs are bit-exact only at the same thread count (docs/reliability.md). The test process
runs on one thread (tests/conftest.py); a victim subprocess does not read that file, so
the job pins its own count rather than inherit its caller's.
"""

from __future__ import annotations

import argparse
import time

import torch

from sparring.config import from_dict
from sparring.train.loop import resume, train
from tests import train_helpers as th

STEPS = 8
THREADS = 1
CONFIG = {
    "algorithm": {"estimator": "test_centered", "objective": "test_clip", "entropy_coef": 0.01,
                  "kl": {"coef": 0.05, "reference": "magnet", "magnet_rate": 0.1}},
    "critic": {"enabled": "on", "coef": 0.5},
    "optim": {"lr": 3e-3, "schedule": "cosine", "warmup_steps": 2},
    "train": {"steps": STEPS, "epochs": 2, "minibatch_size": 8, "microbatch_size": 4, "seed": 11},
    "checkpoint": {"every": 2, "keep": 2},
    "eval": {"every": 3},
    "logging": {"progress": False},
}


def run_job(run_dir, *, block_at: int | None = None, resume_run: bool = False,
            sharding: str = "none"):
    """The job in ``run_dir`` (``sharding``: `distributed.sharding`, for a
    fresh run; a resume reads it from the run folder's config)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        return _run_job(run_dir, block_at=block_at, resume_run=resume_run,
                        sharding=sharding)
    finally:
        torch.set_num_threads(threads)


def _run_job(run_dir, *, block_at: int | None, resume_run: bool, sharding: str):
    th.register()
    model = th.tiny_qwen(0)
    sampler = th.Sampler(123)

    def rollout_fn(step):
        if step == block_at:
            time.sleep(600)
        return th.bandit_rollout(model, sampler)

    @torch.no_grad()
    def eval_fn(step, learners):
        logits = model(input_ids=torch.tensor([[1, 3]])).logits[0, -1]
        return {"p_good": float(torch.softmax(logits, -1)[th.GOOD_TOKEN])}

    if resume_run:
        return resume(run_dir, model, rollout_fn, eval_fn, {"sampler": sampler})
    cfg = {**CONFIG, "distributed": {"sharding": sharding}}
    return train(from_dict(cfg), model, rollout_fn, eval_fn, {"sampler": sampler},
                 run_dir=run_dir)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--block-at", type=int, default=None)
    args = ap.parse_args()
    run_job(args.run_dir, block_at=args.block_at)
