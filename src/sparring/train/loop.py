"""A run's lifecycle around its steps: start or resume, log, evaluate, checkpoint, crash.

``train(cfg, model, rollout_fn, eval_fn)`` runs ``cfg.train.steps`` steps of
`sparring.train.step.TrainingStep` (rollouts -> batch -> advantages -> update, per policy).
After each step: its metrics row to ``metrics.jsonl`` (`sparring.train.metrics`), an
evaluation every ``eval.every`` steps and at the end (``eval_fn``), a checkpoint every
``checkpoint.every`` steps, at the end, and at each step where ``checkpoint.best_metric``
improves (kept apart from ``checkpoint.keep``; `sparring.train.best`).

A crash (exception, Ctrl-C or SIGTERM: `sparring.train.signals`) writes a checkpoint of the
last finished step before the error propagates, when it can be exact: during the rollout
(the model, learner and stage are still as that step left them; the RNGs and the
``stateful`` objects the rollout moves on are snapshotted at each step's start). A crash part-way through the update writes none
(it would mix two steps); the last periodic checkpoint stands. A crash after the update
(in the evaluation, the metrics write or a checkpoint write) keeps the trained step: its
crash checkpoint holds the step's metrics row, and the resume evaluates and logs it first,
from the state the update left, so even then the metrics match an uninterrupted run.

``resume(run_dir, model, rollout_fn, ...)`` continues from the newest intact checkpoint
(skipping, with a warning, any that fail their manifest); with the same seeds on CPU the
metrics match an uninterrupted run. One process at a time trains in a run folder
(`sparring.train.runlock`). With ``lora.enabled`` the adapters are injected into
``model`` in place, so a ``rollout_fn`` that closes over ``model`` samples from the
trained policy. See docs/reliability.md for what survives which failure.

Several policies (``policies``; `sparring.train.policies`): ``model`` is ``{name: model}``
(or the one base with ``lora.shared_base``); each policy trains on its own rows with its
own learner and stage (`sparring.train.step`); a checkpoint holds every policy's weights
and state. ``eval_fn(step, learners)`` gets ``{name: learner}`` in either case ('' names the
one policy of a run).

Several learner ranks (`sparring.train.learner_ranks`): the process of rank 0 runs all of
the above and leads the others through each step's update; `train` and `resume` called on
another rank take part in the updates only, and write nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from sparring.config import Config, ConfigError, read_yaml, save_config, to_dict
from sparring.eval.periodic import EvalFn
from sparring.rollout.source import (
    RolloutSource,
)
from sparring.storage.bounded import read_json_bounded
from sparring.storage.folders import (
    CheckpointError,
    read_tensors,
    sha256_file,
    step_dirs,
    write_tensors,
)
from sparring.storage.metrics_file import METRICS_FILE, set_aside_metrics, truncate_metrics
from sparring.train.best import BestCheckpoint
from sparring.train.checkpoint import (
    FrozenState,
    RNGState,
    latest_checkpoint,
    latest_intact_checkpoint,
    load_checkpoint,
    load_weights,
    save_checkpoint,
    seed_everything,
    tidy_checkpoints,
)
from sparring.train.collector import startup_objects_frozen
from sparring.train.learner_ranks import Leader, follow, is_follower, stops_followers
from sparring.train.metrics import MetricsLogger
from sparring.train.policies import FROZEN_SHA256, Models, TrainedPolicy, trained_policies
from sparring.train.runlock import RunLock, claim_run_dir
from sparring.train.signals import sigterm_as_interrupt
from sparring.train.step import TrainingStep, batch_layout

log = logging.getLogger(__name__)
PENDING_ROW = "unlogged_row"  # crash checkpoint meta: the row of a step whose end failed

# (step, learner or {policy name: learner}) -> metrics
OnRow = Callable[[int, dict[str, Any]], Any]  # a logged row (step, metrics): `train`


class StopTraining(Exception):  # noqa: N818 - a signal, not an error
    """Raised by an ``on_row`` callback: end the run after the step whose row it got."""


CONFIG_FILE = "config.yaml"


def _run_dir(cfg: Config) -> Path:
    return Path(cfg.train.run_dir.format(name=cfg.train.name, time=time.strftime("%Y%m%d-%H%M%S")))


def _load_reference(run: Path, name: str, sha256: str | None) -> dict[str, Tensor]:
    """``run``'s reference weights (file ``name``), checked against the digest its
    checkpoints record."""
    path = run / name
    if not path.exists():
        raise CheckpointError(f"{path} is missing (this run's KL reference)")
    if sha256 is not None and sha256_file(path) != sha256:
        raise CheckpointError(f"{path} does not match the sha256 its checkpoints record "
                              "(corrupted)")
    return read_tensors(path)


def train(cfg: Config, model: Models, rollout_fn: RolloutSource, eval_fn: EvalFn | None = None,
          stateful: Mapping[str, Any] | None = None, *, run_dir: str | Path | None = None,
          pad_id: int = 0, resume: bool = False, on_row: OnRow | None = None) -> Path:
    """Train ``model`` on ``rollout_fn``'s episodes; returns the run folder.

    ``on_row(step, metrics)``: called with every row once it is logged and its checkpoints
    written (step 0: the evaluation before training); raising `StopTraining` in it ends the
    run there, with a checkpoint of that step (not a crash checkpoint).

    ``model``: the model, or with several ``policies`` ``{name: model}`` (with
    ``lora.shared_base``: the one base model; `sparring.train.policies.policy_models`).

    ``stateful``: extra objects with ``state_dict``/``load_state_dict`` (running baselines,
    opponent pools, the rollout's generators) saved in every checkpoint; their state is
    also snapshotted at the start of every step (for an exact crash checkpoint), so it
    should be small. The run folder is created with its marker, or must be empty or a
    Sparring run already (`NotARunFolderError` otherwise: a folder of someone else's is left
    untouched), and is locked while training (`RunLockedError` if another process holds
    it). The objects alive when it starts stay out of the garbage collector's passes until
    it returns (`sparring.train.collector`).
    """
    if is_follower():  # another learner rank's run: its updates only
        follow(cfg, model)
        return Path(run_dir) if run_dir is not None else _run_dir(cfg)
    run = claim_run_dir(Path(run_dir) if run_dir is not None else _run_dir(cfg))
    with sigterm_as_interrupt(), RunLock(run), startup_objects_frozen():
        return _train(cfg, model, rollout_fn, eval_fn, stateful, run, pad_id, resume, on_row)


def _train(cfg: Config, model: Models, rollout_fn: RolloutSource, eval_fn: EvalFn | None,
           stateful: Mapping[str, Any] | None, run: Path, pad_id: int, resume: bool,
           on_row: OnRow | None = None) -> Path:
    """`_train_steps`; with other learner ranks (`sparring.train.learner_ranks`) this
    process leads them and tells them when the run ends."""
    leader = Leader.of_process_group(cfg.distributed.sharding)
    with stops_followers(leader):
        out = _train_steps(cfg, model, rollout_fn, eval_fn, stateful, run, pad_id, resume,
                           on_row, leader)
    if leader is not None:
        leader.stop("finished")
    return out


def _train_steps(cfg: Config, model: Models, rollout_fn: RolloutSource,
                 eval_fn: EvalFn | None, stateful: Mapping[str, Any] | None, run: Path,
                 pad_id: int, resume: bool, on_row: OnRow | None, leader: Leader | None
                 ) -> Path:
    """`train`, with the run folder's lock held: the run's state (fresh or restored from
    its newest intact checkpoint), then its steps (`_Run.step`), each finished by its
    evaluation, metrics row and checkpoints (`_Run.finish`)."""
    tidy_checkpoints(run)
    if not resume:
        if latest_checkpoint(run) is not None:
            raise FileExistsError(f"{run} already holds a run; resume it or pick another run_dir")
        set_aside_metrics(run)
        save_config(cfg, run / CONFIG_FILE)
        seed_everything(cfg.train.seed)
    r = _Run(cfg, run, trained_policies(cfg, model), rollout_fn, eval_fn, stateful, pad_id,
             on_row, leader)
    if resume:
        pending_row = r.resume_state()
    else:
        r.write_references()
        pending_row = None
    if leader is not None:  # every rank starts from these bits
        leader.send_start(r.policies)
    r.open_log()
    try:
        if pending_row is not None:  # the crash checkpoint of a step whose end failed
            r.finish(r.done, row := dict(pending_row))
            if r.stopped(r.done, row):
                return run
        at_start = r.done == 0 and eval_fn is not None and cfg.eval.at_start
        if at_start and r.stopped(0, r.evaluate_at_start()):
            return run
        for i in range(r.done, cfg.train.steps):
            metrics = r.step(i)
            # the step's training is done: a crash from here on keeps it, with its row
            r.done, r.pending, r.boundary = i + 1, metrics, r.snapshot()
            r.finish(i + 1, metrics)
            r.pending, r.boundary = None, r.objects
            if r.stopped(i + 1, metrics):
                if i + 1 not in [s for s, _ in step_dirs(run)]:
                    r.checkpoint(i + 1)
                break
    except BaseException as e:
        r.crash_checkpoint(e)
        raise
    finally:
        r.logger.close()
    return run


class _Run:
    """One run's state between steps: its policies (each a learner and an advantage stage),
    the objects its checkpoints hold, its metrics log and best checkpoint, and what a crash
    checkpoint would save now (``boundary``: the objects as step ``done`` left them, or None
    while the policies are part-way through the next step)."""

    def __init__(self, cfg: Config, run: Path, policies: list[TrainedPolicy],
                 rollout_fn: RolloutSource, eval_fn: EvalFn | None,
                 stateful: Mapping[str, Any] | None, pad_id: int, on_row: OnRow | None,
                 leader: Leader | None = None):
        self.cfg, self.run, self.policies = cfg, run, policies
        self.eval_fn, self.on_row, self.leader = eval_fn, on_row, leader
        self.own = {p.key(k) for p in policies for k in ("learner", "stage")}
        self.objects: dict[str, Any] = {p.key(k): getattr(p, k) for p in policies
                                        for k in ("learner", "stage")}
        self.objects["rng"] = RNGState()
        self.objects.update({f"user.{k}": v for k, v in (stateful or {}).items()})
        self.train_step = TrainingStep(policies, rollout_fn,
                                       batch_layout(cfg, [p.stage for p in policies]), pad_id,
                                       leader)
        # what eval_fn gets: {name: learner} ('' names the one policy of a run)
        self.learners = {p.name: p.learner for p in policies}
        self.ref_sha256: dict[str, str] = {}  # checkpoint meta key -> reference file digest
        self.done = 0  # steps trained
        self.boundary: Mapping[str, Any] | None = self.objects
        self.pending: dict[str, Any] | None = None  # the row of a trained step not yet logged
        self.best = (BestCheckpoint(run, cfg.checkpoint.best_metric, cfg.checkpoint.best_mode)
                     if cfg.checkpoint.best_metric else None)

    # ------------------------------------------------------------ the step

    def step(self, i: int) -> dict[str, Any]:
        """Training step ``i`` (0-based): its metrics. Until the update starts a crash
        checkpoint can be exact (the rollouts move only the RNGs and the user's objects on,
        which ``boundary`` holds as the last step left them); from then on it cannot."""
        self.boundary = self.snapshot()
        return self.train_step(i, before_update=self._policies_changing)

    def _policies_changing(self) -> None:
        self.boundary = None

    def finish(self, step: int, metrics: dict[str, Any]) -> None:
        """The end of a trained step: its evaluation, its row, the best and periodic
        checkpoints."""
        cfg, best = self.cfg, self.best
        every = cfg.eval.every
        last = step == cfg.train.steps
        evaluated = self.eval_fn is not None and (last or bool(every and step % every == 0))
        if evaluated:
            t3 = time.perf_counter()
            metrics.update({f"eval/{k}": v for k, v in self.eval_fn(step, self.learners).items()})
            metrics["time/eval"] = time.perf_counter() - t3
        self.logger.log(step, metrics)
        if best is not None:
            best.check_logged(metrics, evaluated=evaluated)
        improved = best is not None and best.offer(step, metrics)
        if last or (cfg.checkpoint.every and step % cfg.checkpoint.every == 0) or improved:
            self.checkpoint(step)
        if improved:
            best.write()

    def evaluate_at_start(self) -> dict[str, Any]:
        """Step 0's row: the evaluation before training, logged."""
        row = {f"eval/{k}": v for k, v in self.eval_fn(0, self.learners).items()}
        if self.best is not None:
            self.best.check_logged(row, evaluated=True)
        self.logger.log(0, row)
        return row

    def stopped(self, step: int, row: dict[str, Any]) -> bool:
        """``on_row(step, row)``; True when it raised `StopTraining`."""
        try:
            if self.on_row is not None:
                self.on_row(step, row)
        except StopTraining:
            return True
        return False

    # ------------------------------------------------------------ state on disk

    def snapshot(self) -> dict[str, Any]:
        """The checkpoint objects as they are now: the policies' own (which only the update
        changes) by reference, the others copied (`FrozenState`)."""
        return {k: v if k in self.own else FrozenState(v) for k, v in self.objects.items()}

    def write_references(self) -> None:
        """A fresh run: each policy's KL reference weights into the run folder, with their
        digests for the checkpoints' meta."""
        for p in self.policies:
            ref = p.learner.reference_state()
            if ref is not None:
                self.ref_sha256[p.key("reference_sha256")] = sha256_file(
                    write_tensors(self.run / p.reference_file, ref))

    def resume_state(self) -> dict[str, Any] | None:
        """A resumed run: weights, learner, stage, RNG and user state from the newest intact
        checkpoint, the reference weights checked against its digests, the metrics log cut
        back to it. Returns the row its crash checkpoint still holds, if any."""
        run, policies = self.run, self.policies
        ckpt = latest_intact_checkpoint(run, set_aside=True)  # checks every file's sha256
        if ckpt is None:
            raise FileNotFoundError(f"{run} has no checkpoint to resume from")
        has_ref = {p.name: p.learner.reference_state() is not None for p in policies}
        weights = {p.name: load_weights(ckpt, p.weights_name, verify=False) for p in policies}
        doc = load_checkpoint(ckpt, self.objects, verify=False)
        for p in policies:
            p.load_weights(weights[p.name], doc["meta"].get(p.key(FROZEN_SHA256)))
            if has_ref[p.name]:
                key = p.key("reference_sha256")
                digest = doc["meta"].get(key)
                p.learner.load_reference_state(_load_reference(run, p.reference_file, digest))
                self.ref_sha256[key] = digest or sha256_file(run / p.reference_file)  # older
        self.done = int(doc["step"])
        pending_row = doc["meta"].get(PENDING_ROW)
        truncate_metrics(run / METRICS_FILE, self.done - (pending_row is not None))
        save_config(self.cfg, run / CONFIG_FILE)  # the resumed config, once its checkpoint loaded
        return pending_row

    def open_log(self) -> None:
        """The metrics log (from the step the run starts at) and the best checkpoint's
        record."""
        cfg, lg = self.cfg, self.cfg.logging
        self.logger = MetricsLogger(self.run, total_steps=cfg.train.steps, start_step=self.done,
                                    progress=lg.progress, keys=lg.keys,
                                    tensorboard=lg.tensorboard, wandb=lg.wandb,
                                    wandb_project=lg.wandb_project, config=to_dict(cfg))
        if self.best is not None:
            self.best.resume(self.done)

    def checkpoint(self, step: int, stateful: Mapping[str, Any] | None = None,
                   meta: dict[str, Any] | None = None) -> None:
        objects = self.objects if stateful is None else stateful
        if self.leader is not None:  # a sharded optimizer's state, gathered from the ranks
            objects = {**objects, **self.leader.learner_states(step, self.policies)}
        frozen = {p.key(FROZEN_SHA256): p.frozen_sha256() for p in self.policies}
        save_checkpoint(self.run, step,
                        weights={p.weights_name: p.weights() for p in self.policies},
                        stateful=objects,
                        meta={**self.ref_sha256, **{k: v for k, v in frozen.items() if v},
                              **(meta or {})},
                        keep=self.cfg.checkpoint.keep, protect=self.best and self.best.step)

    def crash_checkpoint(self, e: BaseException) -> None:
        """After an exception: a checkpoint of the last finished step, when it can be
        exact (module docstring), else a warning that says where a resume starts."""
        saved = [s for s, _ in step_dirs(self.run)]
        done = self.done
        if done in saved or done == 0:
            return  # nothing to add (a run stopped in its first step simply starts again)
        if self.boundary is None:
            log.warning("%s part-way through step %d: no crash checkpoint (it would mix two "
                        "steps); --resume continues from step %s", type(e).__name__, done + 1,
                        saved[-1] if saved else "0 (none saved: start again)")
            return
        try:
            row = {} if self.pending is None else {PENDING_ROW: self.pending}
            self.checkpoint(done, self.boundary, {"crash": f"{type(e).__name__}: {e}", **row})
        except Exception as save_error:  # e.g. the disk is full: report the first error
            log.warning("could not write a crash checkpoint at step %d: %s", done, save_error)


def check_steps_left(run_dir: str | Path, steps: int) -> None:
    """ConfigError when a run whose newest intact checkpoint is at step N is resumed with
    ``train.steps`` <= N: there is nothing to train (unless step N's row is still to be
    logged: `PENDING_ROW`), and the folder is left as it is."""
    try:  # the checkpoint resume takes (it warns of those it skips)
        ckpt = latest_intact_checkpoint(run_dir, warn=False)
    except CheckpointError:
        return  # no intact checkpoint: the resume says so
    if ckpt is None:
        return
    doc = read_json_bounded(ckpt / "state.json", what="checkpoint state")
    done, ckpt_name = int(doc["step"]), ckpt.name
    pending = PENDING_ROW in doc["meta"]  # its step's evaluation and row are still to come
    if steps == done and not pending:
        raise ConfigError(f"{run_dir} already finished its {done} steps (train.steps={steps}): "
                          f"give train.steps above {done} to continue it")
    if steps < done:
        raise ConfigError(f"train.steps={steps}, but {run_dir} has trained {done} steps "
                          f"(its checkpoint {ckpt_name}): nothing to train; give "
                          f"train.steps above {done} to continue it")


def resume(run_dir: str | Path, model: Models, rollout_fn: RolloutSource,
           eval_fn: EvalFn | None = None, stateful: Mapping[str, Any] | None = None, *,
           overrides: Sequence[str] = (), pad_id: int = 0, on_row: OnRow | None = None,
           cfg: Config | None = None) -> Path:
    """Continue the run in ``run_dir`` from its newest intact checkpoint (its saved config +
    ``overrides``, e.g. ``train.steps=200`` to extend it; ``cfg``: that config when the
    caller has already read it, as ``sparring train --resume`` has, checks included;
    without it the folder's config is read as data, `read_run_config`: no plugin or code
    reference of its own runs)."""
    run = Path(run_dir)
    if is_follower():  # another learner rank's run: its updates only (the leader resumes)
        if cfg is None:
            from sparring.config.run_folder import run_config_from_data

            cfg = run_config_from_data(read_yaml(run / CONFIG_FILE), run / CONFIG_FILE,
                                       list(overrides))
        follow(cfg, model)
        return run
    if not step_dirs(run):
        why = ("does not exist" if not run.is_dir() else
               "has no checkpoint to resume from (a run stopped before its first checkpoint "
               "starts again without --resume)")
        raise FileNotFoundError(f"{run} {why}")
    with sigterm_as_interrupt(), RunLock(run), startup_objects_frozen():
        if cfg is None:  # the folder's config as data: it names no code of its own
            from sparring.config.run_folder import run_config_from_data

            cfg = run_config_from_data(read_yaml(run / CONFIG_FILE), run / CONFIG_FILE,
                                       list(overrides))
        check_steps_left(run, cfg.train.steps)
        return _train(cfg, model, rollout_fn, eval_fn, stateful, run, pad_id, resume=True,
                      on_row=on_row)
