"""Reliability, the loop and checkpoint side: what a run leaves behind when it is stopped,
interrupted, doubled up, or its files are damaged, and that resuming from it is exact.
docs/reliability.md lists each promise with the test here that holds it."""

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sparring.config import from_dict
from sparring.storage.atomic import atomic_write_text
from sparring.storage.folders import CheckpointError, step_dirs
from sparring.storage.metrics_file import read_metrics, truncate_metrics
from sparring.train.checkpoint import (
    latest_intact_checkpoint,
    load_weights,
    save_checkpoint,
    tidy_checkpoints,
)
from sparring.train.learner import Learner, NonFiniteError
from sparring.train.loop import resume, train
from sparring.train.runlock import LOCK_FILE, RunLock, RunLockedError, write_run_marker
from tests import train_helpers as th
from tests.helpers import deadline
from tests.train_resume_job import CONFIG, STEPS

ROOT = Path(__file__).parents[1]
pytestmark = pytest.mark.usefixtures("train_doubles")


def job(run_dir, *, over=None, crash_in_rollout=None, resume_run=False, overrides=(),
        eval_fails_at=None):
    """tests/train_resume_job.py's run (eval every 3, checkpoints at 2, 4, ... keep 2);
    ``crash_in_rollout``: the step index whose rollout samples its episodes (moving every
    RNG on) and then raises KeyboardInterrupt, as a Ctrl-C during generation would;
    ``eval_fails_at``: the step whose evaluation draws from the RNG, then raises."""
    model, sampler = th.tiny_qwen(0), th.Sampler(123)

    def rollout_fn(step):
        episodes = th.bandit_rollout(model, sampler)
        if step == crash_in_rollout:
            raise KeyboardInterrupt
        return episodes

    @torch.no_grad()
    def eval_fn(step, learners):
        if step == eval_fails_at:
            torch.rand(3)  # part-way: the global RNG has moved on
            raise RuntimeError("the evaluation failed")
        logits = model(input_ids=torch.tensor([[1, 3]])).logits[0, -1]
        return {"p_good": float(torch.softmax(logits, -1)[th.GOOD_TOKEN])}

    if resume_run:
        return resume(run_dir, model, rollout_fn, eval_fn, {"sampler": sampler},
                      overrides=overrides)
    cfg = from_dict({**CONFIG, **(over or {})})
    return train(cfg, model, rollout_fn, eval_fn, {"sampler": sampler}, run_dir=run_dir)


def metrics(run):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))}
            for r in read_metrics(run)]


def same_checkpoint(a: Path, b: Path) -> bool:
    """Equal tensors in every safetensors file, equal state.json apart from ``meta``."""
    names = sorted(p.name for p in a.glob("*.safetensors"))
    if names != sorted(p.name for p in b.glob("*.safetensors")):
        return False
    for name in names:
        ta, tb = load_file(str(a / name)), load_file(str(b / name))
        if ta.keys() != tb.keys() or not all(torch.equal(ta[k], tb[k]) for k in ta):
            return False
    da, db = (json.loads((p / "state.json").read_text()) for p in (a, b))
    da.pop("meta"), db.pop("meta")
    return da == db


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """An uninterrupted run with a checkpoint after every step: the oracle."""
    th.register()  # (module fixtures come before the function-scoped train_doubles)
    run = tmp_path_factory.mktemp("full") / "run"
    job(run, over={"checkpoint": {"every": 1, "keep": STEPS}})
    assert [s for s, _ in step_dirs(run)] == list(range(1, STEPS + 1))
    return run


def full_copy(full, tmp_path, keep=(6, 8)):
    """The full run as a run with ``checkpoint.every=2, keep=2`` would leave it."""
    run = tmp_path / "run"
    shutil.copytree(full, run)
    for s, p in step_dirs(run):
        if s not in keep:
            shutil.rmtree(p)
    return run


# ------------------------------------------------------------- (2) crash checkpoints


def test_interrupt_mid_update_writes_no_mixed_checkpoint_and_resume_is_exact(
        full, tmp_path, monkeypatch, caplog):
    """Ctrl-C after the 2nd of step 6's 4 optimizer steps (epochs 2 x 2 mini-batches): the
    weights are half-way between steps 5 and 6, so no step-5 checkpoint may be written;
    --resume continues from step 4 and gives the uninterrupted run's metrics."""
    update, calls = Learner.update, []

    def interrupted_update(self, batch, adv, keep=None):
        calls.append(1)
        if len(calls) == 6:
            seen = []

            def hook(optimizer, args, kwargs):
                seen.append(1)
                if len(seen) == 2:
                    raise KeyboardInterrupt

            self.optimizer.register_step_post_hook(hook)
        return update(self, batch, adv, keep)

    run = tmp_path / "run"
    monkeypatch.setattr(Learner, "update", interrupted_update)
    with pytest.raises(KeyboardInterrupt):
        job(run)
    monkeypatch.setattr(Learner, "update", update)
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2, 3, 4, 5]
    assert [s for s, _ in step_dirs(run)] == [2, 4]
    assert "part-way through step 6: no crash checkpoint" in caplog.text
    job(run, resume_run=True)
    assert metrics(run) == metrics(full)


def test_interrupt_during_rollout_checkpoints_the_step_boundary_exactly(full, tmp_path):
    """Ctrl-C in step 6's rollout, after it sampled (RNGs and the sampler moved on): the
    crash checkpoint at step 5 equals the uninterrupted run's step-5 checkpoint, tensor
    for tensor, and resuming from it gives the uninterrupted run's metrics."""
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        job(run, crash_in_rollout=5)
    dirs = dict(step_dirs(run))
    assert sorted(dirs) == [4, 5]
    meta = json.loads((dirs[5] / "state.json").read_text())["meta"]
    assert meta["crash"].startswith("KeyboardInterrupt")
    assert same_checkpoint(dirs[5], dict(step_dirs(full))[5])
    assert not same_checkpoint(dirs[4], dict(step_dirs(full))[5])  # the check can fail
    job(run, resume_run=True)
    assert metrics(run) == metrics(full)


# ------------------------------------------------------------- (4) one run per folder


def _holder(run: Path) -> subprocess.Popen:
    """Another process that takes ``run``'s lock and sleeps; returns once it holds it."""
    code = ("import sys, time; from sparring.train.runlock import RunLock; "
            "RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(600)")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.Popen([sys.executable, "-c", code, str(run)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"held", proc.stderr.read().decode()
    return proc


def test_a_second_run_on_a_locked_folder_fails_and_a_dead_owners_lock_is_taken_over(
        tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    proc = _holder(run)
    try:
        with pytest.raises(RunLockedError) as err:
            job(run)
        msg = str(err.value)
        assert str(run) in msg and f"pid {proc.pid}" in msg and "\n" not in msg
        assert not (run / "metrics.jsonl").exists() and not (run / "config.yaml").exists()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert (run / LOCK_FILE).read_text().strip() == str(proc.pid)  # left behind by the kill
    caplog.set_level(logging.WARNING)
    job(run)  # takes the stale lock over, says so, and releases it at the end
    assert f"taking over the lock left by pid {proc.pid}" in caplog.text
    assert not (run / LOCK_FILE).exists()
    assert [r["step"] for r in read_metrics(run)] == list(range(STEPS + 1))


def test_lock_is_exclusive_within_a_process_and_released_on_error(tmp_path):
    save_checkpoint(tmp_path, 1, weights={}, stateful={})
    with RunLock(tmp_path):
        assert (tmp_path / LOCK_FILE).read_text().strip() == str(os.getpid())
        with pytest.raises(RunLockedError, match=f"pid {os.getpid()}"):
            RunLock(tmp_path).acquire()
        with pytest.raises(RunLockedError):
            resume(tmp_path, th.tiny_qwen(0), lambda step: [])  # before it touches config
    assert not (tmp_path / LOCK_FILE).exists()
    with pytest.raises(RuntimeError, match="inside"), RunLock(tmp_path):
        raise RuntimeError("inside the locked block")
    assert not (tmp_path / LOCK_FILE).exists()


# ------------------------------------------------------------- (9) damaged files


def _truncate(path: Path, keep: float = 0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _flip_last_byte(path: Path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x5A  # inside the tensor data: the file still parses
    path.write_bytes(bytes(data))


def _as_older(ckpt: Path):
    """``ckpt`` as a checkpoint written before manifests: no manifest, no ``format``."""
    (ckpt / "manifest.json").unlink()
    doc = json.loads((ckpt / "state.json").read_text())
    del doc["format"]
    (ckpt / "state.json").write_text(json.dumps(doc))


DAMAGE = {
    "truncated weights": (lambda c: _truncate(c / "model.safetensors"), "bytes, the manifest"),
    "garbled weights": (lambda c: _flip_last_byte(c / "model.safetensors"), "sha256"),
    "truncated state.json": (lambda c: _truncate(c / "state.json"), "bytes, the manifest"),
    "empty state.safetensors": (lambda c: (c / "state.safetensors").write_bytes(b""),
                                "bytes, the manifest"),
    "missing manifest and no step": (
        lambda c: ((c / "manifest.json").unlink(), (c / "state.json").write_text('{"state": {}}')),
        "no integer 'step'"),
    "older checkpoint (no manifest) with torn weights": (
        lambda c: (_as_older(c), _truncate(c / "model.safetensors", 0.001)),
        "not a readable safetensors file"),
    "manifest deleted, weights garbled": (  # its state.json says it has a manifest
        lambda c: ((c / "manifest.json").unlink(), _flip_last_byte(c / "model.safetensors")),
        "manifest.json is missing"),
    "manifest with string values": (
        lambda c: (c / "manifest.json").write_text('{"files": {"model.safetensors": "x"}}'),
        "not a valid manifest"),
    "manifest entry /dev/zero": (
        lambda c: (c / "manifest.json").write_text(
            '{"files": {"/dev/zero": {"bytes": 0, "sha256": "%s"}}}' % ("0" * 64)),
        "'/dev/zero' is not a file name inside the folder"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_resume_skips_a_damaged_checkpoint_and_stays_exact(full, tmp_path, caplog, damage):
    """The newest checkpoint (step 8) damaged: resume warns which one it skipped and why,
    sets it aside, redoes steps 7 and 8 from step 6 and matches the uninterrupted run."""
    run = full_copy(full, tmp_path)
    harm, why = DAMAGE[damage]
    harm(dict(step_dirs(run))[8])
    caplog.set_level(logging.WARNING)
    with deadline(300):  # (a manifest naming /dev/zero must not hang)
        job(run, resume_run=True)
    assert metrics(run) == metrics(full)
    skipped = [r.getMessage() for r in caplog.records if "skipping checkpoint" in r.getMessage()]
    assert len(skipped) == 1 and "step_000008" in skipped[0]
    assert why in skipped[0], skipped[0]
    assert [p.name.startswith("corrupt-step_000008") for p in (run / "checkpoints").iterdir()
            ].count(True) == 1
    assert same_checkpoint(dict(step_dirs(run))[8], dict(step_dirs(full))[8])


def test_no_intact_checkpoint_is_one_clear_error_and_garbled_weights_do_not_load(full, tmp_path):
    run = full_copy(full, tmp_path)
    for _, ckpt in step_dirs(run):
        _flip_last_byte(ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match="step_000008.*sha256.*step_000006.*sha256") as e:
        latest_intact_checkpoint(run)
    assert str(run) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(CheckpointError, match="model.safetensors does not match its sha256"):
        load_weights(dict(step_dirs(run))[8], "model")  # what eval / play load


def test_reference_weights_are_checked_against_the_checkpoints(tmp_path):
    run = tmp_path / "run"
    cfg = {"algorithm": {**CONFIG["algorithm"], "kl": {"coef": 0.1, "reference": "initial"}},
           "train": {**CONFIG["train"], "steps": 2}}
    job(run, over=cfg)
    ref = run / "reference.safetensors"
    assert set(load_file(str(ref))) == set(th.tiny_qwen(0).state_dict())
    digest = json.loads((dict(step_dirs(run))[2] / "state.json").read_text())["meta"]
    assert len(digest["reference_sha256"]) == 64
    _flip_last_byte(ref)
    with pytest.raises(CheckpointError, match="reference.safetensors does not match"):
        job(run, resume_run=True, overrides=["train.steps=3"])  # (2 steps: finished)


def test_torn_metrics_lines(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.25}\n{"step": 3, "lo')
    caplog.set_level(logging.WARNING)
    assert read_metrics(tmp_path) == [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25}]
    assert f"{path}: dropping its torn last line 3" in caplog.text
    truncate_metrics(path, 1)  # what resume does: the torn line goes too
    assert path.read_text() == '{"step": 1, "loss": 0.5}\n'
    path.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(ValueError, match=f"{path}: line 2 is not a metrics row"):
        read_metrics(path)


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path):
    path = tmp_path / "config.yaml"
    atomic_write_text(path, "a: 1\n")

    class Boom(Exception):
        pass

    def write(tmp):
        tmp.write_text("a: 2 and then the disk fill")
        raise Boom

    from sparring.storage.atomic import atomic_write

    with pytest.raises(Boom):
        atomic_write(path, write)
    assert path.read_text() == "a: 1\n" and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_save_killed_while_replacing_a_step_is_put_back(tmp_path):
    class Box:
        def state_dict(self):
            return {"x": 1}

    ckpt = save_checkpoint(tmp_path, 4, weights={}, stateful={"b": Box()})
    root = ckpt.parent
    ckpt.rename(root / ".old-step_000004-abcd1234")  # killed between the two renames
    (root / ".tmp-step_000006-0000aaaa").mkdir()  # and a half-written save
    tidy_checkpoints(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == ["step_000004"]
    assert latest_intact_checkpoint(tmp_path) == ckpt


# ------------------------------------------------------------- (10) runs stopped early


def test_a_fresh_run_sets_stale_metrics_aside_and_resume_needs_a_checkpoint(
        full, tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    write_run_marker(run)  # a run killed before its first checkpoint: its marker, metrics
    stale = '{"step": 0, "eval/p_good": 0.1}\n{"step": 1, "loss": 9.0}\n'
    (run / "metrics.jsonl").write_text(stale)
    with pytest.raises(FileNotFoundError, match=f"{run} has no checkpoint to resume from"):
        job(run, resume_run=True)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        job(tmp_path / "nowhere", resume_run=True)
    caplog.set_level(logging.WARNING)
    job(run)
    assert metrics(run) == metrics(full)  # each step once
    aside = list(run.glob("metrics.stale-*.jsonl"))
    assert len(aside) == 1 and aside[0].read_text() == stale
    assert aside[0].name in caplog.text


# ------------------------------------------------------------- (11) non-finite weights


def _opt_state(learner):
    return {i: {k: v.clone() for k, v in s.items()}
            for i, s in enumerate(learner.optimizer.state[p] for p in learner.params)
            if s}


def test_a_step_that_makes_weights_non_finite_is_undone_bit_for_bit():
    from tests.test_train_learner import make_cfg, ragged_batch

    batch, adv = ragged_batch()
    cfg = make_cfg(train__max_skipped_updates=3, train__minibatch_size=2,
                   optim__weight_decay=0.01)
    learner = Learner(th.tiny_qwen(1), cfg)
    assert learner.update(batch, adv)["optimizer_steps"] == 4  # 7 rows, mini-batches of 2
    weights = [p.detach().clone() for p in learner.params]
    state = _opt_state(learner)
    assert len(state) == len(learner.params)

    def unchanged():
        after = _opt_state(learner)
        return (all(torch.equal(p, w) for p, w in zip(learner.params, weights))
                and after.keys() == state.keys()
                and all(torch.equal(after[i][k], state[i][k]) for i in state for k in state[i]))

    for g in learner.optimizer.param_groups:
        g["lr"] = math.inf  # optim.lr=inf: the step would make every weight NaN
    with pytest.raises(NonFiniteError, match="3 consecutive updates had a non-finite weight"):
        learner.update(batch, adv)
    assert unchanged()
    assert all(g["fused"] for g in learner.optimizer.param_groups)  # on a CPU too
    for g in learner.optimizer.param_groups:
        g["lr"] = 1e39  # unfused, torch raises part-way through the step: still put back
        g["fused"] = None
    with pytest.raises(RuntimeError, match="overflow"):
        learner.update(batch, adv)
    assert unchanged()


def test_a_step_another_rank_cannot_keep_is_undone_here_and_a_raise_waits_for_the_vote():
    """`guarded_step` with ``agree`` (a sharded optimizer's vote over the ranks): a finite
    step is undone bit for bit when another rank votes it down; a step that raises here
    votes no, is put back, and raises after the vote."""
    from sparring.train.guarded_step import guarded_step

    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(4, 3))
    opt = torch.optim.AdamW([p], lr=1e-2)
    p.grad = torch.randn(4, 3)
    opt.step()  # AdamW state exists
    before = (p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items()})
    votes = []

    def another_rank_says_no(ok):
        votes.append(ok)
        return False

    p.grad = torch.randn(4, 3)
    assert not guarded_step(opt, float(p.grad.norm()), agree=another_rank_says_no)
    assert votes == [True, True]  # this rank could prove it and did keep it
    assert torch.equal(p, before[0])
    assert all(torch.equal(opt.state[p][k], v) for k, v in before[1].items())
    votes.clear()
    opt.param_groups[0]["lr"] = 1e39  # torch raises part-way through the step
    with pytest.raises(RuntimeError, match="overflow"):
        guarded_step(opt, float(p.grad.norm()), agree=lambda ok: votes.append(ok) or ok)
    assert votes == [False, False]
    assert torch.equal(p, before[0])


def test_a_run_with_a_huge_lr_stops_with_its_weights_untouched(tmp_path):
    model = th.tiny_qwen(0)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    sampler = th.Sampler(1)
    cfg = from_dict({**CONFIG, "eval": {"every": 0, "at_start": False},
                     "train": {**CONFIG["train"], "max_skipped_updates": 3}})
    cfg.optim.lr = math.inf  # as `optim.lr=inf` on the command line is (still) accepted
    with pytest.raises(NonFiniteError, match="non-finite weight"):
        train(cfg, model, lambda step: th.bandit_rollout(model, sampler), run_dir=tmp_path)
    assert all(torch.equal(v, initial[k]) for k, v in model.state_dict().items())
    assert step_dirs(tmp_path) == []  # nothing non-finite was checkpointed


def test_a_failed_evaluation_keeps_the_trained_step(tmp_path):
    """An evaluation that raises (e.g. minimax on Connect Four) loses no step trained since
    the last checkpoint: the step it evaluated is kept in a crash checkpoint with its row,
    and the resume evaluates and logs it first: the metrics of an uninterrupted run."""
    full = tmp_path / "full"
    job(full)
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="the evaluation failed"):
        job(run, eval_fails_at=3)  # step 3: evaluated, not a periodic checkpoint
    assert [s for s, _ in step_dirs(run)] == [2, 3]
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]  # its row waits in the checkpoint
    job(run, resume_run=True)
    assert metrics(run) == metrics(full)
    last = tmp_path / "last"  # the final step's evaluation: its resume still has work to do
    with pytest.raises(RuntimeError, match="the evaluation failed"):
        job(last, eval_fails_at=CONFIG["train"]["steps"])
    job(last, resume_run=True)
    assert metrics(last) == metrics(full)
