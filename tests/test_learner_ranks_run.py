"""A whole run on 2 learner ranks (`sparring.train.learner_ranks`, gloo, forked processes):
the job of tests/train_resume_job.py (magnet KL, a critic, a cosine schedule, two epochs of
mini- and micro-batches) run by `train` on both ranks.

* Its metrics equal those of the same job in one process, to float32 summation order
  (the ranks sum their shares' gradients in another order): every row to rel 1e-5.
* Rank 1 dies between two steps (its process exits after its update of step 5): rank 0
  finds it at step 6's header, before anything changed its policy, writes an exact crash
  checkpoint of step 5 and raises `RankLostError`. Resumed on 2 fresh ranks, the run's
  metrics equal those of an uninterrupted 2-rank run bit for bit.
* ``sparring train`` under torchrun (slow): a run and its ``--resume`` on 2 ranks, and 2
  ranks beside 2 Ray rollout workers; `distributed.learner_ranks=2` (a Ray actor as rank 1)
  with a rollout worker; two policies on 2 ranks; SIGTERM to torchrun, then ``--resume``.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file

from sparring.storage.folders import step_dirs
from sparring.storage.metrics_file import read_metrics
from sparring.train.learner import Learner
from sparring.train.learner_ranks import RankLostError
from tests import test_train_resume_cli as cli
from tests import train_helpers as th
from tests.test_learner_ranks import _free_port, collect_before_fork, sharded_forward
from tests.train_resume_job import STEPS, run_job

pytestmark = pytest.mark.usefixtures("train_doubles")

ROOT = Path(__file__).parents[1]
WORLD = 2
DIES_AFTER = 5  # rank 1's process exits after its update of this step


def _rank(rank: int, port: int, run_dir: str, mode: str, sharding: str) -> None:
    """One rank of a 2-rank job: ``full`` (train), ``dies`` (rank 1 exits after step
    ``DIES_AFTER``'s update; rank 0 records what it raised) or ``resume``, with
    ``distributed.sharding: <sharding>``."""
    th.register()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    if mode == "dies" and rank == 1:
        update, calls = Learner.update, [0]

        def dying_update(self, *args, **kwargs):
            out = update(self, *args, **kwargs)
            calls[0] += 1
            if calls[0] == DIES_AFTER:
                os._exit(3)  # no cleanup, as a killed process
            return out

        Learner.update = dying_update
    try:
        run_job(run_dir, resume_run=mode == "resume", sharding=sharding)
    except RankLostError as e:
        with open(f"{run_dir}.error", "w") as f:
            json.dump({"rank": rank, "error": str(e)}, f)
    finally:
        if mode != "dies":
            dist.destroy_process_group()


def _on_ranks(run_dir, mode: str, sharding: str = "none") -> list[int]:
    """Run both ranks to their end (each left to finish on its own: a rank that dies does
    not stop the other); their exit codes."""
    ctx = mp.get_context("fork")
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, str(run_dir), mode, sharding))
             for r in range(WORLD)]
    collect_before_fork()
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    for p in procs:
        if p.is_alive():
            p.kill()
    return [p.exitcode for p in procs]


def assert_rows_close(a: list[dict], b: list[dict], same_keys: bool = True) -> None:
    """Metrics rows ``b`` equal ``a`` to float32 summation order (rel 1e-5, abs 1e-7), row
    for row; ``same_keys=False``: ``b`` may log more (rollout workers' own keys)."""
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        if same_keys:
            assert ra.keys() == rb.keys()
        for k, v in ra.items():
            assert rb[k] == pytest.approx(v, rel=1e-5, abs=1e-7), (ra["step"], k)


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))}
            for r in rows]


def _finished_run(tmp_path_factory, sharding: str):
    """The job's run folder after both ranks trained it to the end, sharded as given."""
    run = tmp_path_factory.mktemp(sharding) / "full"
    assert _on_ranks(run, "full", sharding=sharding) == [0, 0]
    return run


def pop_half_held(whole: list[dict], sharded: list[dict]) -> None:
    """Rank 0's optimizer state under sharding is about half that of the same rows held
    whole, row for row after the first (the evaluation before training); the entries are
    taken out of both so the rest can be compared."""
    held = "optimizer_state_mb"
    for row_w, row_s in zip(whole[1:], sharded[1:]):
        assert 0.3 * row_w[held] < row_s.pop(held) < 0.7 * row_w.pop(held)


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    return _finished_run(tmp_path_factory, "none")


def test_two_ranks_match_one_process(two_rank_run, tmp_path):
    one = run_job(tmp_path / "one")
    a, b = _strip(read_metrics(one)), _strip(read_metrics(two_rank_run))
    assert [r["step"] for r in b] == list(range(STEPS + 1))
    assert_rows_close(a, b)
    assert b[1]["optimizer_steps"] == 2 * 2  # 16 rows / minibatch 8, two epochs


def test_a_lost_rank_ends_the_run_with_an_exact_crash_checkpoint(two_rank_run, tmp_path):
    run = tmp_path / "dies"
    assert _on_ranks(run, "dies") == [0, 3]
    err = json.loads((tmp_path / "dies.error").read_text())
    assert err["rank"] == 0 and "step 6's header" in err["error"]
    assert [s for s, _ in step_dirs(run)] == [4, DIES_AFTER]  # periodic 4, crash 5
    assert [r["step"] for r in read_metrics(run)] == list(range(DIES_AFTER + 1))
    assert _on_ranks(run, "resume") == [0, 0]
    assert _strip(read_metrics(run)) == _strip(read_metrics(two_rank_run))


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    return _finished_run(tmp_path_factory, "optimizer")


def test_a_sharded_optimizer_repeats_the_unsharded_run(two_rank_run, sharded_run):
    """The same weights and moments (AdamW's arithmetic per element is unchanged), so the
    same metrics bit for bit, but for the optimizer state rank 0 holds: about half; its
    checkpoints hold the whole optimizer state."""
    sharded, full = _strip(read_metrics(sharded_run)), _strip(read_metrics(two_rank_run))
    pop_half_held(full, sharded)
    assert sharded == full
    (_, full_ckpt), (_, sharded_ckpt) = step_dirs(two_rank_run)[-1], step_dirs(sharded_run)[-1]
    full, sharded = (load_file(c / "state.safetensors") for c in (full_ckpt, sharded_ckpt))
    assert any(".exp_avg_sq" in k for k in full)
    assert sharded.keys() == full.keys()
    for k, t in full.items():
        assert torch.equal(sharded[k], t), k


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    return _finished_run(tmp_path_factory, "full")


def test_sharded_weights_match_one_process(fsdp_run, tmp_path):
    """Weights, gradients and optimizer state sharded (FSDP2): one process's metrics, its
    learner on the forward the sharded model runs (rel 1e-5), with rank 0 holding
    about half of the optimizer state; the checkpoint holds it whole."""
    with sharded_forward():
        one = run_job(tmp_path / "one")
    a, b = _strip(read_metrics(one)), _strip(read_metrics(fsdp_run))
    pop_half_held(a, b)
    assert_rows_close(a, b)
    (_, ckpt_one), (_, ckpt_two) = step_dirs(one)[-1], step_dirs(fsdp_run)[-1]
    whole, gathered = (load_file(c / "state.safetensors") for c in (ckpt_one, ckpt_two))
    assert any(".exp_avg_sq" in k for k in whole)
    assert gathered.keys() == whole.keys()
    for k, t in whole.items():
        # atol 1e-5: a key's bias has a gradient of rounding noise alone (the softmax over
        # the keys ignores what is added to all of them), which Adam scales up to a step
        torch.testing.assert_close(gathered[k], t, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("sharding, uninterrupted", [("optimizer", "sharded_run"),
                                                     ("full", "fsdp_run")])
def test_a_lost_rank_when_sharded_resumes_from_the_last_checkpoint(sharding, uninterrupted,
                                                                    request, tmp_path):
    """Rank 1's shards (of the optimizer state; of the weights too) are lost with it: no
    crash checkpoint; the run resumes on 2 ranks from the last periodic one and repeats
    the uninterrupted sharded run bit for bit."""
    run = tmp_path / "dies"
    assert _on_ranks(run, "dies", sharding=sharding) == [0, 3]
    assert [s for s, _ in step_dirs(run)] == [2, 4]
    assert [r["step"] for r in read_metrics(run)] == list(range(DIES_AFTER + 1))
    assert _on_ranks(run, "resume", sharding=sharding) == [0, 0]
    assert _strip(read_metrics(run)) == _strip(read_metrics(request.getfixturevalue(uninterrupted)))


def _torchrun(*args, ranks=WORLD):
    """``sparring train ARGS`` under torchrun on ``ranks`` CPU ranks (one thread each)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}",
           "--master-port", str(_free_port()), "-m", "sparring", "train", *args]
    return subprocess.run(cmd, cwd=ROOT, env=cli._env(), capture_output=True, text=True,
                          timeout=600)


def _run_and_resume(tmp_path, *on_ranks: str) -> tuple[list[str], tuple[list, list]]:
    """The command line's job for 2 steps, then ``--resume`` to 4: in one process, and under
    torchrun on 2 ranks with ``on_ranks`` overrides too. Returns the job's arguments and
    the two metrics logs (the 2-rank one checked to have every step)."""
    args = [a for a in cli.ARGS if not a.startswith(("train.steps=", "eval.every="))]
    args.append("eval.every=2")
    one, two = tmp_path / "one", tmp_path / "two"
    for cmd in (cli._cmd(*args, "train.steps=2", f"train.run_dir={one}"),
                cli._cmd("--resume", str(one), "train.steps=4")):
        subprocess.run(cmd, cwd=ROOT, env=cli._env(), check=True, capture_output=True,
                       timeout=300)
    for done in (_torchrun(*args, *on_ranks, "train.steps=2", f"train.run_dir={two}"),
                 _torchrun("--resume", str(two), "train.steps=4")):
        assert done.returncode == 0, done.stderr[-3000:]
    b = cli._metrics(two)
    assert [r["step"] for r in b] == list(range(5))
    return args, (cli._metrics(one), b)


@pytest.mark.slow
def test_torchrun_runs_and_resumes_sparring_train_on_two_ranks(tmp_path):
    """The command line under torchrun: 2 steps, then ``--resume`` to 4, on 2 ranks, logs
    the metrics of the same in one process (to float32 summation order); ``--print-config``
    leaves the other rank nothing to take part in, and every rank exits cleanly."""
    args, (a, b) = _run_and_resume(tmp_path)
    assert_rows_close(a, b)
    for _ in range(3):  # the ranks end at once: a group left to the teardown could abort
        printed = _torchrun(*args, "--print-config")
        assert printed.returncode == 0, printed.stderr[-3000:]
        assert printed.stdout.count("\nplugins:") == 1  # printed by rank 0 only


@pytest.mark.slow
def test_torchrun_with_sharded_weights_runs_and_resumes(tmp_path):
    """``sparring train`` under torchrun with ``distributed.sharding=full``: 2 steps, then
    ``--resume`` to 4, on 2 ranks, logs one process's metrics (rel 1e-5: the sharded
    model runs its own forward, one process the top layer at the action tokens alone)."""
    _, (a, b) = _run_and_resume(tmp_path, "distributed.sharding=full")
    pop_half_held(a, b)
    assert_rows_close(a, b)


@pytest.mark.slow
def test_two_ranks_with_two_rollout_workers_log_one_process_metrics(tmp_path):
    """2 learner ranks under torchrun, rank 0 driving 2 synchronous Ray rollout workers:
    the metrics of one process with none (to float32 summation order)."""
    pytest.importorskip("ray")
    args = [a for a in cli.ARGS if not a.startswith(("train.steps=", "checkpoint.every="))]
    args += ["train.steps=3", "checkpoint.every=0"]
    one, two = tmp_path / "one", tmp_path / "two"
    subprocess.run(cli._cmd(*args, f"train.run_dir={one}"), cwd=ROOT, env=cli._env(),
                   check=True, capture_output=True, timeout=300)
    done = _torchrun(*args, "distributed.rollout_workers=2", f"train.run_dir={two}")
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = cli._metrics(one), cli._metrics(two)
    assert [r["step"] for r in b] == list(range(4))
    assert_rows_close(a, b, same_keys=False)
    assert all("distributed/restarts" in r for r in b[1:])


@pytest.mark.slow
def test_learner_ranks_on_ray_with_a_rollout_worker_log_one_process_metrics(tmp_path):
    """``distributed.learner_ranks=2`` (rank 1 a Ray actor) with a Ray rollout worker:
    the metrics of one process (to float32 summation order)."""
    pytest.importorskip("ray")
    args = [a for a in cli.ARGS if not a.startswith(("train.steps=", "checkpoint.every="))]
    args += ["train.steps=3", "checkpoint.every=0"]
    one, two = tmp_path / "one", tmp_path / "two"
    for run, extra in ((one, []), (two, ["distributed.learner_ranks=2",
                                         "distributed.rollout_workers=1"])):
        done = subprocess.run(cli._cmd(*args, *extra, f"train.run_dir={run}"), cwd=ROOT,
                              env=cli._env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    a, b = cli._metrics(one), cli._metrics(two)
    assert [r["step"] for r in b] == list(range(4))
    assert_rows_close(a, b, same_keys=False)


def test_learner_ranks_below_one_is_a_config_error():
    from sparring.config import ConfigError, from_dict

    with pytest.raises(ConfigError, match="learner_ranks"):
        from_dict({"distributed": {"learner_ranks": 0}})


@pytest.mark.slow
def test_two_policies_on_two_ranks_log_one_process_metrics(tmp_path):
    """Several policies: each policy's learner data-parallel over the same 2 ranks (the
    signalling recipe's speaker and listener), the metrics of one process."""
    args = ["signalling_two_policies", "train.steps=3", "eval.every=0",
            "logging.progress=false"]
    one, two = tmp_path / "one", tmp_path / "two"
    subprocess.run(cli._cmd(*args, f"train.run_dir={one}"), cwd=ROOT, env=cli._env(),
                   check=True, capture_output=True, timeout=300)
    done = _torchrun(*args, f"train.run_dir={two}")
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = cli._metrics(one), cli._metrics(two)
    assert [r["step"] for r in b] == list(range(4))
    assert any(k.startswith("policy/listener/") for k in b[1])
    assert_rows_close(a, b)


@pytest.mark.slow
def test_sigterm_to_torchrun_then_resume_repeats_the_uninterrupted_run(tmp_path):
    """SIGTERM to torchrun (a scheduler's preemption) once step 5 is logged: rank 0 writes
    the crash checkpoint of step 5 (when the signal lands in step 6's rollout; in its
    update, none, and step 4's stands); ``--resume`` on 2 ranks then logs the
    uninterrupted 2-rank run's metrics bit for bit."""
    args = [a for a in cli.ARGS if not a.startswith(("checkpoint.every=", "eval.every="))]
    args += ["checkpoint.every=4", "eval.every=0"]
    full, stopped = tmp_path / "full", tmp_path / "stopped"
    done = _torchrun(*args, f"train.run_dir={full}")
    assert done.returncode == 0, done.stderr[-3000:]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={WORLD}",
           "--master-port", str(_free_port()), "-m", "sparring", "train", *args,
           f"train.run_dir={stopped}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=cli._env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = stopped / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 6:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    steps = [s for s, _ in step_dirs(stopped)]
    assert 4 in steps and max(steps) < cli.STEPS, steps
    resumed = _torchrun("--resume", str(stopped))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert cli._metrics(stopped) == cli._metrics(full)
