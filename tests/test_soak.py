"""Soak (slow): 1,000 Kuhn steps (64 episodes each: the recipe's model and pipeline at a
quarter of its batch, so it runs in minutes) with an opponent pool; memory stays flat and
the run folder stays within its disk bound. Figures: ``pytest -m slow tests/test_soak.py -s``
prints them (docs/reliability.md)."""

import os
from pathlib import Path

import pytest

from sparring.assembly.run import build
from sparring.config import find_recipe, load_config
from sparring.storage.folders import step_dirs
from sparring.train.loop import train

STEPS, WARMUP = 1000, 100
POOL_MAX, KEEP, POOL_EVERY, CHECKPOINT_EVERY = 3, 2, 10, 50


def rss_mib() -> float:
    """Resident set size of this process (Linux /proc)."""
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def folder_mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")
def test_soak_rss_flat_and_disk_bounded(tmp_path):
    cfg = load_config(find_recipe("kuhn_selfplay"), [
        f"train.steps={STEPS}", "rollout.episodes_per_step=64", "eval.every=0", "eval.at_start=false", "logging.progress=false",
        "envs.0.opponents=[self,pool]", f"league.every={POOL_EVERY}",
        f"league.max={POOL_MAX}", "league.bots=[random]",
        f"checkpoint.every={CHECKPOINT_EVERY}", f"checkpoint.keep={KEEP}"])
    run = tmp_path / "soak"
    parts = build(cfg, run)
    rss: list[float] = []

    def rollout_fn(step):
        rss.append(rss_mib())
        return parts.rollout_fn(step)

    parts_rollout = parts.rollout_fn
    rollout_fn.state_dict = parts_rollout.state_dict  # type: ignore[attr-defined]
    train(cfg, parts.model, rollout_fn, parts.eval_fn, parts.stateful, run_dir=run,
          pad_id=parts.pad_id)
    after_warmup, end = rss[WARMUP], max(rss[-50:])
    growth = end / after_warmup - 1
    snapshots = [p for p in (run / "pool").iterdir() if p.is_dir()]
    print(f"\nRSS after {WARMUP} steps {after_warmup:.0f} MiB, max of the last 50 of {STEPS} "
          f"{end:.0f} MiB: growth {growth:+.2%}; run folder {folder_mib(run):.1f} MiB, "
          f"{len(step_dirs(run))} checkpoints, {len(snapshots)} pool snapshots")
    assert growth < 0.05
    assert len(step_dirs(run)) <= KEEP
    # league.max's help: league.max snapshots plus the one a crash checkpoint may still
    # need, plus each kept checkpoint's pool (at most the snapshots of the `every` steps
    # before it, one per league.every steps); bounded whatever the length
    assert len(snapshots) <= POOL_MAX + 1 + KEEP * CHECKPOINT_EVERY // POOL_EVERY
    assert not list(run.rglob("*.tmp*"))
