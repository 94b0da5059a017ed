"""Wire a `Config` into the parts of a run: ``build(cfg, run_dir) -> RunParts``.

`sparring.assembly.parts.build_parts` builds the model, the rollouts and the evaluation in
this process. With ``distributed.rollout_workers`` the rollouts run on Ray actors
(`sparring.distributed.RayRollouts`), each of which builds its own parts with
`build_parts` (with the run's ``model.backend``), while the driver keeps the plain
rollouts as its plan of the step. With ``distributed.learner_ranks`` > 1 this process is
rank 0 of that many learner ranks, the others Ray actors
(`sparring.distributed.RayLearnerRanks`). ``sparring train`` passes the parts to
`sparring.train.loop.train`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from sparring.assembly.parts import RunParts, build_parts, load_model, model_precision
from sparring.config import Config


def build(cfg: Config, run_dir: str | Path | None = None) -> RunParts:
    """The parts of ``cfg`` (`build_parts`), with the rollouts on Ray workers when
    ``distributed.rollout_workers`` asks for them, and this process rank 0 of
    ``distributed.learner_ranks`` learner ranks on Ray when there are several; pool
    snapshots go under ``run_dir`` (default ``runs/unnamed``). ``RunParts.close`` ends
    what was started."""
    ranks = None
    if cfg.distributed.learner_ranks > 1:  # the actors build their models meanwhile
        from sparring.distributed import RayLearnerRanks

        ranks = RayLearnerRanks(cfg, build_follower)
    try:
        parts = _build(cfg, run_dir)
    except BaseException:
        if ranks is not None:
            ranks.close()
        raise
    if ranks is not None:
        parts.started.append(ranks)
    return parts


def _build(cfg: Config, run_dir: str | Path | None) -> RunParts:
    if not cfg.distributed.rollout_workers:
        return build_parts(cfg, run_dir)
    from sparring.distributed import RayRollouts

    # the workers sample (each with the run's backend); the driver's rollouts only plan
    parts = build_parts(replace(cfg, model=replace(cfg.model, backend="hf")), run_dir)
    parts.rollout_fn = RayRollouts(cfg, parts.rollout_fn, parts.model,
                                   Path(run_dir or "runs/unnamed"), build_parts)
    return parts


def build_follower(cfg: Config) -> Any:
    """The models a learner rank other than 0 trains (`sparring.train.learner_ranks`):
    ``build_parts``'s, sampled by no one here (the HF backend, no engines, no rollout
    workers, nothing written)."""
    return build_parts(replace(cfg, model=replace(cfg.model, backend="hf"))).model


__all__ = ["RunParts", "build", "build_follower", "load_model", "model_precision"]
