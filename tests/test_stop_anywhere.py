"""Stopped at a random moment (SIGINT, SIGTERM or SIGKILL), resumed: the metrics are those of a run
that was never stopped, with no line duplicated or lost.

The victim is tests/train_resume_job.py in a subprocess; the moment is drawn from a seeded
generator after the run has logged its first row, so it falls anywhere in the rollouts,
the updates, the evaluations or the checkpoint writes."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparring.storage.folders import step_dirs
from sparring.storage.metrics_file import read_metrics
from tests.train_resume_job import STEPS, run_job

ROOT = Path(__file__).parents[1]
MOMENTS = random.Random(16)


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))}
            for r in rows]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run = tmp_path_factory.mktemp("full")
    run_job(run)
    return _strip(read_metrics(run))


@pytest.mark.parametrize("sig", [
    signal.SIGINT, signal.SIGKILL, signal.SIGTERM,
    pytest.param(signal.SIGINT, marks=pytest.mark.slow),
    pytest.param(signal.SIGKILL, marks=pytest.mark.slow)],
    ids=["int-a", "kill-a", "term-a", "int-b", "kill-b"])
def test_stop_at_a_random_moment_then_resume(sig, uninterrupted, tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.train_resume_job", str(run)], cwd=ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while not (run / "metrics.jsonl").exists() or not read_metrics(run):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.time() < deadline, "the victim logged nothing"
            time.sleep(0.05)
        time.sleep(MOMENTS.uniform(0.0, 3.0))
        if proc.poll() is None:
            proc.send_signal(sig)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    finished = [r["step"] for r in read_metrics(run)] == list(range(STEPS + 1)) \
        and step_dirs(run)[-1][0] == STEPS  # (the signal may come after the end)
    if not finished:
        if not step_dirs(run):  # stopped before its first checkpoint: it starts again
            run_job(run)
        else:
            run_job(run, resume_run=True)
    assert _strip(read_metrics(run)) == uninterrupted
