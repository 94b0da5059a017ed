"""One rollout worker: what a Ray actor of `sparring.distributed.rollouts.RayRollouts` runs.

A worker builds the run's parts as ``sparring train`` does, with the function the driver
hands it (``build_parts``: `sparring.assembly.parts.build_parts`), with no workers of its own: the model, its policy backend (HF, or the vLLM engine with
``model.backend=vllm``), the environments and the rollout schedule. It never trains; the
driver sends it

* weights (`set_weights`, through the Ray object store, or `receive_weights`, a collective
  broadcast from the driver), tagged with a version (the number of updates they include);
* the opponent pools' state with every share of groups to play (`play`): the driver owns
  the pools (their snapshots, their checkpointed state), the worker only samples from them. Pool
  snapshots are read from ``RUN_DIR/pool``, so on several machines the run folder must be
  on storage every node sees.

`play` returns the share's episodes, each tagged ``info["weights_version"]``.
The class is plain Python: `RayRollouts` wraps it with ``ray.remote``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sparring.config import Config, DistributedConfig
from sparring.config.plan import GroupTask
from sparring.data import Episode
from sparring.distributed.weights import distinct_models, load_weights, model_device


class RolloutWorker:
    def __init__(self, cfg: Config, run_dir: str, rank: int,
                 build_parts: Callable[[Config, Path], Any]):
        """``build_parts(cfg, run_dir)``: the run's parts (an object with ``model`` and
        ``rollout_fn``), as the driver builds them."""
        from sparring.plugins import import_plugins
        from sparring.train.policies import policy_models

        import_plugins(cfg.plugins)  # the envs, estimators ... they register
        model = cfg.model
        if model.device.startswith("cuda"):  # the learner's GPU index means nothing here:
            if not torch.cuda.is_available():  # Ray shows each worker its own GPUs
                raise RuntimeError(f"rollout worker {rank}: model.device={model.device} but "
                                   "this worker sees no GPU (set distributed.worker_gpus)")
            model = dataclasses.replace(model, device="cuda")
        self.rank = rank
        local = dataclasses.replace(cfg, model=model, distributed=DistributedConfig())
        self.parts = build_parts(local, Path(run_dir))
        self.model = self.parts.model  # one model, or {policy name: model}
        # LoRA attached in place as the driver's training loop does: the same weight names
        policy_models(local, self.model)
        self.version = -1
        self._league: dict[str, Any] | None = None
        self._group: Any = None  # the collective weight group, when one is formed

    def pid(self) -> int:
        return os.getpid()

    # ------------------------------------------------------------------ weights

    def set_weights(self, version: int, state: dict[str, Tensor]) -> int:
        """Load ``state`` (all weights, or only the trainable ones) as ``version``."""
        self._load(state)
        self.version = version
        return version

    def _load(self, state: dict[str, Tensor]) -> None:
        unexpected = load_weights(self.model, state)
        if unexpected:
            raise KeyError(f"rollout worker {self.rank}: weights the model does not have: "
                           f"{unexpected[:5]}")
        for m in distinct_models(self.model).values():
            m.eval()

    def join_group(self, host: str, port: int, world: int, backend: str,
                   timeout_s: float) -> bool:
        """Join the driver's weight group as rank ``self.rank + 1`` (a previous group is
        dropped; `sparring.distributed.weights.CollectiveSync`)."""
        from sparring.distributed.weights import make_group, tcp_store

        store = tcp_store(host, port, world, timeout_s)
        self._group = (make_group(backend, store, world, self.rank + 1, timeout_s), store)
        return True

    def receive_weights(self, version: int, layout: list[tuple[str, list[int], str]]) -> int:
        """Receive a broadcast of the tensors ``layout`` names (name, shape, dtype) from the
        driver (rank 0) into the model, as ``version``."""
        from sparring.distributed.weights import receive_broadcast

        if self._group is None:
            raise RuntimeError(f"rollout worker {self.rank} is in no weight group")
        self._load(receive_broadcast(self._group[0], layout, model_device(self.model)))
        self.version = version
        return version

    # ------------------------------------------------------------------ rollouts

    def collect(self, step: int, tasks: Sequence[GroupTask], league: dict[str, Any],
             version: int) -> tuple[list[Episode], dict[str, float]]:
        """The episodes of ``tasks`` at ``step`` with the weights of ``version`` (which must
        be loaded: the driver sends them first), the opponent pools as ``league`` (the
        driver's `Rollouts.state_dict`), and the worker's timings."""
        if version != self.version:
            raise RuntimeError(f"rollout worker {self.rank}: asked for weights version "
                               f"{version}, has {self.version}")
        if league != self._league:  # the driver's pools changed (held snapshots stay loaded)
            self.parts.rollout_fn.load_state_dict(league)
            self._league = league
        t0 = time.perf_counter()
        episodes = self.parts.rollout_fn.collect(step, tasks)
        for ep in episodes:
            ep.info["weights_version"] = version
        return episodes, {"play_s": time.perf_counter() - t0}
