"""`RayRollouts`: a run's rollout function with the rollouts on Ray actors.

The driver (the training process) keeps the learner and the run's `Rollouts` (the opponent
pool, its snapshots and its checkpointed state); ``distributed.rollout_workers`` actors
(`sparring.distributed.worker.RolloutWorker`) play the episodes. Per step:

1. the driver does the pool's upkeep (`Rollouts.begin_step`) and publishes the learner's
   weights, version ``step`` (the number of updates in them; `sparring.distributed.weights`);
2. the step's groups (`group_tasks`) are cut into one contiguous share per worker
   (`split_groups`); each worker gets, in its queue, the weights (when its version differs)
   and ``play(step, share, league, version)`` (the league: the state of the opponent
   pools, one per policy with several);
3. the shares come back and are concatenated in worker order, which is group order.

Every group is seeded from (seed, step, env, opponent kind, group index) alone
(`sparring.rollout.rollouts`), so in ``sync`` mode the episodes, hence the metrics, are
those of the single-process run. In ``async`` mode the driver keeps the next
``max_staleness`` steps queued: step ``s + k``'s shares are queued at step ``s`` with the
weights of version ``s``, and the workers play them while the learner updates; the step's
metrics give the staleness, and `correct` (called by the training loop after the advantage
stage, once per policy) applies the truncated importance weights of `sparring.importance`
against that policy's learner.

Faults: a worker that dies (its process killed, its node lost) fails the futures of its
queue; the driver starts a replacement (with a collective weight group: replacements for
all workers, see `sparring.distributed.weights`), gives it the weights each lost share was
planned with, and queues those shares again. Results are kept per share and a share's episodes
are taken only from the call that completed it, so no episode is counted twice, and a
replayed share is the same episodes (same seeds, same weights). More than
``distributed.max_restarts`` replacements in one step fail the step.

Checkpoints: the workers hold no state of their own beyond the weights, which the driver
sends again after a resume, so `sparring.train.loop` checkpoints the driver's `Rollouts`
as with no workers, and a sync run resumes exactly (with any number of workers). An async
run resumes with an empty queue: its first ``max_staleness`` steps after the resume use
fresher weights than the uninterrupted run did, so it does not repeat it bit for bit.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from sparring.config import Config
from sparring.config.plan import GroupTask, group_tasks
from sparring.data import Episode, TurnBatch
from sparring.distributed.split import split_groups
from sparring.distributed.weights import (
    CollectiveSync,
    ObjectStoreSync,
    model_device,
    weights_to_send,
)
from sparring.distributed.worker import RolloutWorker
from sparring.extras import import_extra, install_hint
from sparring.importance import importance_weights, stale_level
from sparring.rollout.rollouts import Rollouts

log = logging.getLogger(__name__)

INSTALL_HINT = install_hint("ray")


def require_ray() -> Any:
    """The ``ray`` module, or an ImportError naming the install command."""
    return import_extra("ray", "ray", "distributed.rollout_workers")


@dataclass
class _Share:
    """One worker's part of one step, queued on that worker."""

    worker: int
    step: int
    tasks: list[GroupTask]
    version: int
    future: Any = None
    done: bool = False  # its result is in (a replacement never plays it again)
    result: Any = None  # (episodes, timings) from the call that completed it


class RayRollouts:
    """``rollouts(step) -> episodes`` on Ray actors; see the module docstring."""

    def __init__(self, cfg: Config, local: Rollouts, model: nn.Module | Mapping[str, nn.Module],
                 run_dir: str | Path, build_parts: Callable[[Config, Path], Any]):
        """``model``: the learner's model, or ``{policy name: model}`` with several
        policies (what the workers mirror, `sparring.distributed.weights.distinct_models`);
        ``build_parts``: what each worker builds its parts with (a module-level function,
        which Ray sends by reference)."""
        self.ray = ray = require_ray()
        self.cfg, self.local, self.model = cfg, local, model
        self.build_parts = build_parts
        self.run_dir = str(Path(run_dir).resolve())
        d = cfg.distributed
        if not ray.is_initialized():
            ray.init(address=d.address, include_dashboard=False, ignore_reinit_error=True)
        self.n = d.rollout_workers
        self.mode, self.lag = d.mode, (d.max_staleness if d.mode == "async" else 0)
        tasks = group_tasks(cfg)
        self.shares = split_groups(tasks, [cfg.envs[t.spec].group_size for t in tasks], self.n)
        self._actor = ray.remote(num_cpus=d.worker_cpus, num_gpus=d.worker_gpus,
                                 max_restarts=0)(RolloutWorker)
        self.workers: list[Any] = [self._spawn(w) for w in range(self.n)]
        self.versions = [-1] * self.n  # the weights version each worker's queue ends with
        self.sync: ObjectStoreSync | CollectiveSync = self._make_sync()
        self.published = -1
        self.pending: dict[int, list[_Share]] = {}  # step -> its shares in flight
        self.metrics: dict[str, float] = {}
        self._reform = False

    # ------------------------------------------------------------------ set-up

    def _spawn(self, w: int) -> Any:
        return self._actor.remote(self.cfg, self.run_dir, w, self.build_parts)

    def _make_sync(self) -> ObjectStoreSync | CollectiveSync:
        d = self.cfg.distributed
        device = model_device(self.model)
        collective = d.weight_sync == "collective" or (d.weight_sync == "auto"
                                                       and d.worker_gpus > 0)
        if not collective:
            return ObjectStoreSync(self.ray)
        backend = "nccl" if device.type == "cuda" else "gloo"
        sync = CollectiveSync(self.ray, backend, device)
        sync.form(self.workers)
        return sync

    def pids(self) -> list[int]:
        """The workers' process ids (for tests and monitoring)."""
        return self.ray.get([w.pid.remote() for w in self.workers])

    # ------------------------------------------------------------------ one step

    def __call__(self, step: int) -> list[Episode]:
        restarts = 0
        self.local.begin_step(step)
        t0 = time.perf_counter()
        self._publish(step)
        t1 = time.perf_counter()
        last = min(step + self.lag, self.cfg.train.steps - 1)
        for t in range(step, max(last, step) + 1):
            if t not in self.pending:
                self._queue(t, version=step)
        shares = self.pending[step]
        while not all(s.done for s in shares):  # as they finish: a death shows at once
            waiting = {s.future: s for s in shares if not s.done}
            ready, _ = self.ray.wait(list(waiting), num_returns=1)
            share = waiting[ready[0]]
            try:
                share.result = self.ray.get(share.future)
                share.done = True
            except self.ray.exceptions.RayActorError as e:
                restarts += 1
                if restarts > self.cfg.distributed.max_restarts:
                    raise RuntimeError(
                        f"step {step}: rollout workers died {restarts} times "
                        f"(distributed.max_restarts={self.cfg.distributed.max_restarts})"
                    ) from e
                log.warning("rollout worker %d died in step %d (%s); starting a replacement "
                            "and replaying its share", share.worker, step, type(e).__name__)
                self._replace(share.worker)
        episodes = [ep for s in shares for ep in s.result[0]]  # worker order: group order
        self.local.record(episodes)  # the learner's scores against the pool (pfsp)
        play_s = [s.result[1]["play_s"] for s in shares]
        del self.pending[step]
        self.sync.keep_only({s.version for later in self.pending.values() for s in later}
                            | {self.published})
        self.metrics = {"distributed/restarts": float(restarts),
                        "time/weight_sync": t1 - t0,
                        "time/worker_play_max": max(play_s, default=0.0)}
        if self.mode == "async":  # updates between an episode's weights and this step's
            stale = [step - int(ep.info.get("weights_version", step)) for ep in episodes]
            self.metrics["distributed/staleness_mean"] = sum(stale) / max(len(stale), 1)
            self.metrics["distributed/staleness_max"] = float(max(stale, default=0))
        return episodes

    def _publish(self, version: int) -> None:
        """Make the learner's current weights available as ``version`` (once per version)."""
        if version == self.published:
            return
        if self._reform:  # after a replacement: a new group (the old one is dropped)
            self.sync.form(self.workers)
            self._reform = False
        state = weights_to_send(self.model, first=self.published < 0)
        self.sync.publish(version, state)
        self.published = version
        if isinstance(self.sync, CollectiveSync):
            self.sync.broadcast()  # queued on every worker, in order with their plays
            self.versions = [version] * self.n

    def _queue(self, step: int, version: int) -> None:
        league = self.local.state_dict()
        shares = [_Share(w, step, tasks, version) for w, tasks in enumerate(self.shares) if tasks]
        for s in shares:
            self._submit(s, league)
        self.pending[step] = shares

    def _submit(self, share: _Share, league: dict[str, Any]) -> None:
        w = share.worker
        if self.versions[w] != share.version:
            if not self.sync.has(share.version):  # collective: only the newest is at hand
                share.version = self.published
            if self.versions[w] != share.version:
                self._send_weights(w, share.version)
        share.future = self.workers[w].collect.remote(share.step, share.tasks, league,
                                                   share.version)

    def _send_weights(self, w: int, version: int) -> None:
        if isinstance(self.sync, CollectiveSync):  # a replaced worker: the object store
            fb = self.sync.fallback
            if not fb.has(version):
                fb.publish(version, weights_to_send(self.model, first=True))
            fb.send(self.workers[w], version)
        else:
            self.sync.send(self.workers[w], version)
        self.versions[w] = version

    def _replace(self, w: int) -> None:
        """A new actor for worker ``w``, and its unfinished shares queued on it again. With a
        collective weight group every worker is replaced: the others may be waiting in a
        broadcast for the dead one (the group is formed anew at the next publish)."""
        replaced = list(range(self.n)) if isinstance(self.sync, CollectiveSync) else [w]
        for v in replaced:
            with contextlib.suppress(Exception):  # the dead one is gone already
                self.ray.kill(self.workers[v], no_restart=True)
            self.workers[v] = self._spawn(v)
            self.versions[v] = -1
        self._reform = isinstance(self.sync, CollectiveSync)
        league = self.local.state_dict()
        for step in sorted(self.pending):
            for s in self.pending[step]:
                if s.worker in replaced and not s.done:
                    self._submit(s, league)

    # ------------------------------------------------------------------ the loop's hook

    def rollout_metrics(self) -> dict[str, float]:
        """The step's worker metrics (restarts, weight sync and play times) and, in async
        mode, the staleness of its episodes (read by the training loop)."""
        return dict(self.metrics)

    def correct(self, step: int, batch: TurnBatch, adv: Tensor,
                learner: Any) -> tuple[TurnBatch, Tensor, dict[str, float]]:
        """Called by the training loop after the advantage stage, once per policy (its rows,
        its learner): in async mode, unless ``algorithm.importance_correction`` (that
        policy's) is off, the truncated importance weights of the rows against that
        learner's policy before its update."""
        c = getattr(learner, "cfg", self.cfg).algorithm.importance_correction
        level = stale_level(c.level)
        if self.mode == "sync" or level == "off" or not batch.n_rows:
            return batch, adv, {}
        # the learner's policy before this update (the proximal policy of decoupled PPO),
        # from the values pass when that gave it (`Learner.annotate`)
        logp_old = (batch.learner_logp if batch.learner_logp is not None
                    else learner.policy_logprobs(batch))
        weights, stats = importance_weights(logp_old, batch.old_logp, batch.action_mask,
                                            level=level, clip=c.clip)
        metrics = {f"distributed/is_{k}": v for k, v in stats.items()}
        return batch.with_fields(old_logp=logp_old), adv * weights.to(adv.device), metrics

    # ------------------------------------------------------------------ state, shutdown

    def league_metrics(self) -> dict[str, float]:
        return self.local.league_metrics()

    def state_dict(self) -> dict[str, Any]:
        return self.local.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.local.load_state_dict(state)

    def close(self) -> None:
        """Stop the workers (the Ray instance stays up for whoever started it); also done
        when this object is garbage-collected."""
        if not self.__dict__.get("workers"):
            return
        try:
            self.sync.close()
        finally:
            for w in self.workers:
                with contextlib.suppress(Exception):
                    self.ray.kill(w, no_restart=True)
            self.workers = []
            self.pending.clear()

    def __del__(self) -> None:  # a dropped run frees its actors' CPUs and GPUs for the next
        with contextlib.suppress(Exception):
            self.close()

    def __getattr__(self, name: str) -> Any:  # arena, pool, policy ...: the driver's
        if name.startswith("_") or name in ("local",):
            raise AttributeError(name)
        return getattr(self.local, name)
