"""Learner ranks as Ray actors: ``distributed.learner_ranks: N`` without torchrun.

This process becomes rank 0 of a ``torch.distributed`` group of N learner ranks, and ranks
1..N-1 are Ray actors (`LearnerRankActor`, one CPU each, and one GPU each when the model
is on CUDA) that build the run's models and take part in every update
(`sparring.train.learner_ranks.follow`); the run itself is the one torchrun's ranks make
(`sparring.train.learner_ranks`). The group meets at a TCP address of this node (gloo on
CPUs, NCCL on GPUs), so the actors may be on any node of the Ray cluster that can reach
it. Rollout workers (``distributed.rollout_workers``) are separate actors, driven by rank 0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from sparring.config import Config, DistributedConfig
from sparring.distributed.rollouts import require_ray
from sparring.train.learner_ranks import init_group

PLACE_TIMEOUT_S = 300  # how long Ray may take to start the actors before the run gives up


def _backend(cfg: Config) -> str:
    return "nccl" if cfg.model.device.startswith("cuda") else "gloo"


class LearnerRankActor:
    """Rank ``rank`` of ``world``: joins the group at ``address`` (``HOST:PORT``), then
    follows rank 0's run until it ends, on the models ``build_models(cfg)`` gives
    (`sparring.assembly.run.build_follower`, handed down by the caller). Plain Python;
    `RayLearnerRanks` wraps it with ``ray.remote``."""

    def __init__(self, cfg: Config, rank: int, world: int, address: str,
                 build_models: Callable[[Config], Any]):
        from sparring.plugins import import_plugins

        import_plugins(cfg.plugins)
        model = cfg.model
        if model.device.startswith("cuda"):  # Ray shows each actor its own GPU
            model = dataclasses.replace(model, device="cuda")
        self.cfg = dataclasses.replace(cfg, model=model, distributed=DistributedConfig())
        self.rank, self.world, self.address = rank, world, address
        self.backend, self.build_models = _backend(cfg), build_models

    def pid(self) -> int:
        return os.getpid()

    def run(self) -> None:
        from sparring.train.learner_ranks import follow

        torch.set_num_threads(1)
        init_group(self.backend, init_method=f"tcp://{self.address}", rank=self.rank,
                   world_size=self.world)
        try:
            follow(self.cfg, self.build_models(self.cfg))
        finally:
            dist.destroy_process_group()


class RayLearnerRanks:
    """Ranks 1..N-1 on Ray and this process as rank 0, the group formed (module docstring);
    ``build_models`` as `LearnerRankActor` takes it; `close` ends the group and the
    actors."""

    def __init__(self, cfg: Config, build_models: Callable[[Config], Any]):
        ray = self.ray = require_ray()
        d = cfg.distributed
        if not ray.is_initialized():
            ray.init(address=d.address, include_dashboard=False, ignore_reinit_error=True)
        if dist.is_initialized():
            raise RuntimeError("distributed.learner_ranks: this process is already in a "
                               "torch.distributed group (torchrun?); under torchrun the "
                               "ranks are torchrun's: leave distributed.learner_ranks at 1")
        host = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        address, world = f"{host}:{port}", d.learner_ranks
        gpus = 1 if cfg.model.device.startswith("cuda") else 0
        actor = ray.remote(num_cpus=1, num_gpus=gpus, max_restarts=0)(LearnerRankActor)
        self.actors = [actor.remote(cfg, r, world, address, build_models)
                       for r in range(1, world)]
        try:
            ray.get([a.pid.remote() for a in self.actors], timeout=PLACE_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise RuntimeError(
                f"distributed.learner_ranks={world}: Ray did not start {world - 1} learner "
                f"rank actor(s) (1 CPU{' and 1 GPU' if gpus else ''} each) within "
                f"{PLACE_TIMEOUT_S} s: the cluster has too few free resources (rollout "
                "workers take theirs too)") from None
        self.runs = [a.run.remote() for a in self.actors]
        device = torch.device(cfg.model.device)
        if device.type == "cuda" and device.index is not None:  # NCCL's buffers on this
            torch.cuda.set_device(device)  # rank's own GPU (model.device), not on GPU 0
        init_group(_backend(cfg), init_method=f"tcp://{address}", rank=0, world_size=world)

    def close(self) -> None:
        """After the run (rank 0 has told the others it ended): wait for the actors to
        return, then end the group and the actors."""
        with contextlib.suppress(Exception):
            self.ray.get(getattr(self, "runs", []), timeout=60)
        if dist.is_initialized():
            dist.destroy_process_group()
        for a in self.actors:
            with contextlib.suppress(Exception):
                self.ray.kill(a, no_restart=True)
        self.actors = []

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def pids(self) -> list[int]:
        return self.ray.get([a.pid.remote() for a in self.actors])


__all__ = ["LearnerRankActor", "RayLearnerRanks"]
