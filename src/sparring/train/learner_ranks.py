"""A run on several learner ranks: ``torchrun --nproc-per-node N -m sparring train ...``,
or ``distributed.learner_ranks: N`` (ranks 1..N-1 as Ray actors:
`sparring.distributed.RayLearnerRanks`).

Rank 0 (the *leader*) runs the whole run as one process would: rollouts, advantages,
evaluation, the run folder, checkpoints, metrics and the weight sync to rollout workers.
Ranks 1..N-1 (the *followers*) hold a copy of every trained policy and take part in its
updates only: each rank trains on its share of every mini-batch and the gradients are
summed over the ranks (`sparring.train.data_parallel`), so every rank leaves a step with
the weights one process would have. The leader sends, from rank 0 on the default process
group (`broadcast_object_list`):

1. the run's start state, fresh or resumed from a checkpoint: each policy's trained
   weights, learner state (optimizer, schedule, row permutation generator) and KL
   reference, so that every rank starts from the same bits;
2. before each step's update, a header ``("update", step)``: a rank that has died is
   found here, before anything changes the policies, and the leader's crash checkpoint
   of the last finished step is exact;
3. then each policy's rows: ``[(batch, advantages, keep)]``, in the run's policy order;
4. with ``distributed.sharding: optimizer`` or ``full`` (each rank keeps its own share of
   the optimizer state, or of the weights, gradients and optimizer state, from the start
   state on: `sparring.train.sharded_optimizer`, `sparring.train.sharded_weights`), before each
   checkpoint a header ``("state", step)``, and every rank joins the gathering of each
   policy's learner state in policy order (`gather_learner_states`); a rank lost between
   two steps then leaves no crash checkpoint;
5. at the end, or when the leader stops between two updates, ``("stop", why)``.

A rank lost part-way through an update ends the run at the leader's next collective with
the error (no crash checkpoint: it would mix two steps; the last periodic one stands).
Collectives time out after `RANK_TIMEOUT` (a hung rank, not a dead one: a dead rank's
connections close and its peers fail at once). The followers wait for the next header
through the leader's rollouts and evaluation, so a step's rollouts and evaluation together
must take less than that.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from sparring.config import Config
from sparring.data import TurnBatch
from sparring.train import data_parallel as dp
from sparring.train.checkpoint import FrozenState
from sparring.train.data_parallel import LEADER
from sparring.train.policies import Models, TrainedPolicy, trained_policies

log = logging.getLogger(__name__)

RANK_TIMEOUT = datetime.timedelta(hours=1)


class RankLostError(RuntimeError):
    """A learner rank stopped answering (its process died, or a collective timed out)."""


def init_group(backend: str, **kwargs: Any) -> None:
    """`dist.init_process_group` with `RANK_TIMEOUT`, after importing `torch.distributed.nn`.
    That module's functions take ``group=group.WORLD`` as a default argument: imported once
    the group exists (transformers' ``modeling_utils`` imports it), it keeps the group alive
    for the life of the interpreter, its gloo threads outlive `dist.destroy_process_group`,
    and the process can abort at exit ("terminate called without an active exception")."""
    import torch.distributed.nn  # noqa: F401  (its defaults capture no group yet)

    dist.init_process_group(backend, timeout=RANK_TIMEOUT, **kwargs)


def start_learner_ranks() -> dp.Ranks | None:
    """The default process group of the ranks `torchrun` started (``WORLD_SIZE`` > 1 in
    the environment; NCCL on each rank's own GPU, ``LOCAL_RANK``, when CUDA is available,
    else gloo), this rank and size; None when the process is alone (or already in a group
    of one)."""
    if dist.is_available() and dist.is_initialized():
        return dp.ranks()
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "nccl"
    else:
        backend = "gloo"
    init_group(backend)
    return dp.ranks()


@contextlib.contextmanager
def torchrun_ranks() -> Iterator[dp.Ranks | None]:
    """`start_learner_ranks` for the length of the block; a group it started is left at the
    end, by every rank. When the block ended without an error the ranks wait for each other
    first: a gloo group torn down while a peer is still in it, or left to the interpreter's
    teardown, can abort the process ("terminate called without an active exception");
    `init_group` keeps anything else from holding it past `dist.destroy_process_group`."""
    started = not (dist.is_available() and dist.is_initialized())
    ranks = start_learner_ranks()
    if ranks is None or not started:
        yield ranks
        return
    together = False
    try:
        yield ranks
        together = True
    finally:
        if together:
            with contextlib.suppress(RuntimeError):  # a peer that ended with its own error
                dist.barrier()
        dist.destroy_process_group()


def is_follower() -> bool:
    """True on ranks 1..N-1 of a group of learner ranks."""
    r = dp.ranks()
    return r is not None and r.rank != LEADER


def share(obj: Any = None) -> Any:
    """``obj`` from the leader, on every rank (the leader's own ``obj`` is what it sends)."""
    box = [obj]
    dist.broadcast_object_list(box, src=LEADER)
    return box[0]


def start_state(policies: Sequence[TrainedPolicy]) -> list[dict[str, Any]]:
    """Each policy's weights, learner state and frozen KL reference (None without one)."""
    return [{"weights": p.weights(), "frozen_sha256": p.frozen_sha256(),
             "learner": p.learner.state_dict(), "reference": p.learner.reference_state()}
            for p in policies]


def load_start_state(policies: Sequence[TrainedPolicy], state: list[dict[str, Any]]) -> None:
    if len(state) != len(policies):
        raise RankLostError(f"the leader trains {len(state)} policies, this rank "
                            f"{len(policies)}: the ranks were given different configs")
    for p, st in zip(policies, state):
        p.load_weights(st["weights"], st["frozen_sha256"])
        p.learner.load_state_dict(st["learner"])
        if st["reference"] is not None:
            p.learner.load_reference_state(st["reference"])


def shard(policies: Sequence[TrainedPolicy], sharding: str) -> None:
    """Each policy's learner state sharded as ``distributed.sharding`` says, once every
    rank holds the start state: its optimizer state (``optimizer``), or the weights the
    update trains with their gradients and optimizer state (``full``)."""
    for p in policies:
        if sharding == "optimizer":
            p.learner.shard_optimizer()
        elif sharding == "full":
            p.learner.shard_weights()


class Leader:
    """Rank 0's side of the protocol (module docstring). ``mid_update`` is True from a
    step's header until every policy's update is done: the ranks are then inside the same
    collectives, and no stop message can be sent."""

    def __init__(self, ranks: dp.Ranks, sharding: str = "none"):
        self.ranks = ranks
        self.sharding = sharding
        self.mid_update = False

    @property
    def sharded(self) -> bool:
        """Whether each rank holds a share of the learner state (`learner_states` then
        gathers it for a checkpoint)."""
        return self.sharding != "none"

    @classmethod
    def of_process_group(cls, sharding: str = "none") -> Leader | None:
        """The leader of the current group of learner ranks; None in one process. A
        follower must not run the leader's loop (`ValueError`)."""
        r = dp.ranks()
        if r is None:
            return None
        if r.rank != LEADER:
            raise ValueError(f"rank {r.rank} of {r.size}: followers take part in updates "
                             "only (`sparring.train.learner_ranks.follow`)")
        return cls(r, sharding)

    def _send(self, what: str, obj: Any) -> None:
        try:
            share(obj)
        except RuntimeError as e:  # gloo/NCCL: a peer's connection closed, or a timeout
            raise RankLostError(f"a learner rank did not receive {what} ({self.ranks.size} "
                                f"ranks): {e}") from e

    def send_start(self, policies: Sequence[TrainedPolicy]) -> None:
        """The run's start state to every rank; then, with a sharded optimizer, each rank
        keeps its own share of it."""
        self._send("the run's start state", dp.to_cpu(start_state(policies)))
        shard(policies, self.sharding)

    def learner_states(self, step: int, policies: Sequence[TrainedPolicy]
                       ) -> dict[str, FrozenState]:
        """With a sharded optimizer: each policy's whole learner state for step ``step``'s
        checkpoint, gathered from every rank (by `TrainedPolicy.key`); else {} (rank 0
        holds it whole)."""
        if not self.sharded:
            return {}
        self._send(f"step {step}'s checkpoint header", ("state", step))
        try:
            return gather_learner_states(policies)
        except RuntimeError as e:
            raise RankLostError(f"a learner rank did not send its optimizer state for step "
                                f"{step}'s checkpoint: {e}") from e

    def begin_update(self, step: int) -> None:
        """Step ``step``'s header (0-based), before anything changes the policies."""
        self._send(f"step {step + 1}'s header", ("update", step))
        self.mid_update = True

    def send_rows(self, rows: Sequence[tuple[TurnBatch, Tensor, Tensor]]) -> None:
        self._send("the step's rows", dp.to_cpu(list(rows)))

    def end_update(self) -> None:
        self.mid_update = False

    def stop(self, why: str) -> None:
        """Tell the followers the run ended (``why``), when they are waiting for a header;
        part-way through an update they are not, and find the leader gone instead."""
        if self.mid_update:
            return
        try:
            share(("stop", why))
        except RuntimeError as e:
            log.warning("could not tell the other learner ranks that the run ended: %s", e)


@contextlib.contextmanager
def stops_followers(leader: Leader | None) -> Iterator[None]:
    """On an exception inside, tell the other learner ranks the run ended (``leader``
    None: one process, nothing to tell), then let it propagate."""
    try:
        yield
    except BaseException as e:
        if leader is not None:
            leader.stop(f"rank 0 stopped: {type(e).__name__}: {e}")
        raise


def gather_learner_states(policies: Sequence[TrainedPolicy]) -> dict[str, FrozenState]:
    """Each policy's learner state, in policy order: a collective of every rank (the
    sharded optimizer's state is whole on rank 0 only)."""
    return {p.key("learner"): FrozenState(p.learner) for p in policies}


def follow(cfg: Config, model: Models) -> None:
    """A follower's run: the start state, then every step's update, until the leader stops
    (`Leader`). ``model`` as `sparring.train.loop.train` takes it (LoRA is attached here
    as there)."""
    r = dp.ranks()
    if r is None or r.rank == LEADER:
        raise ValueError("follow() runs on ranks 1..N-1 of a group of learner ranks")
    policies = trained_policies(cfg, model)
    state = share()
    if isinstance(state, tuple):  # the leader stopped before its run started
        log.info("rank %d: the run ended before its first step (%s)", r.rank, state[1])
        return
    load_start_state(policies, state)
    shard(policies, cfg.distributed.sharding)
    while True:
        kind, arg = share()
        if kind == "stop":
            log.info("rank %d: the run ended (%s)", r.rank, arg)
            return
        if kind == "state":
            gather_learner_states(policies)
            continue
        rows = share()
        if len(rows) != len(policies):
            raise RankLostError(f"step {arg + 1}: rows for {len(rows)} policies, this rank "
                                f"trains {len(policies)}")
        for p, (batch, adv, keep) in zip(policies, rows):
            p.learner.update(batch, adv, keep)
