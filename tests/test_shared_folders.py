"""Folders Sparring did not make, or made for other arguments, are never deleted or written
over: `sparring sweep` into an output folder holding a user's folder, a rerun with other
overrides, a seed folder a live run holds, a second sweep into the same folder; a killed
sweep takes its trainers with it; `train.run_dir` naming a folder that is no run."""

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sparring
from sparring.train.runlock import RunLock
from tests.helpers import cli, one_line

SRC = Path(sparring.__file__).resolve().parents[1]  # the sparring under test
TINY = ["train.steps=1", "eval.games=4", "rollout.episodes_per_step=8", "envs.0.group_size=4",
        "eval.opponents=[random]", "eval.at_start=false"]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def sweep_args(out: Path, *overrides: str, seeds: str = "0") -> list:
    return ["sweep", "default", "--seeds", seeds, "--jobs", "1", "--threads", "1",
            "--out", out, *TINY, *overrides]


def seed_args(seed: int, *overrides: str) -> list[str]:
    """The `sparring train` arguments `sweep_args` gives seed ``seed`` (its study.json)."""
    return ["default", *TINY, *overrides, "train.steps=1", f"train.seed={seed}",
            "logging.progress=false"]


@pytest.mark.parametrize("marked", [False, True], ids=["plain-out", "sweep-out"])
def test_a_users_folder_in_the_sweep_output_is_left_untouched(marked, tmp_path, capsys):
    """`--out` holding the user's seed0/important.txt: the folder was deleted without a
    word. Now the sweep stops with one line naming it, before anything runs, whether or
    not the output folder is an earlier sweep's."""
    out = tmp_path / "sw"
    (out / "seed0").mkdir(parents=True)
    (out / "seed0" / "important.txt").write_text("mine")
    if marked:
        (out / "sweep.json").write_text(json.dumps({"kind": "sweep"}))
    before = snapshot(out)
    rc, _, err = cli(capsys, *sweep_args(out))
    assert rc == 2
    line = one_line(err)
    assert "seed0" in line and "--out" in line
    assert snapshot(out) == before  # nothing deleted, nothing written (no log either)


def test_a_rerun_with_other_overrides_refuses_and_deletes_nothing(tmp_path, capsys):
    """The rerun deleted the finished run and trained it again with the new overrides.
    Now it names the folder and what differs; the same arguments still reuse the run."""
    out = tmp_path / "sw"
    assert cli(capsys, *sweep_args(out))[0] == 0
    finished = snapshot(out / "seed0")
    assert "metrics.jsonl" in finished and "study.json" in finished
    rc, _, err = cli(capsys, *sweep_args(out, "eval.games=6"))
    assert rc == 2
    line = one_line(err)
    assert str(out / "seed0") in line and "eval.games=6" in line and "nothing was deleted" in line
    assert snapshot(out / "seed0") == finished
    rc, stdout, _ = cli(capsys, *sweep_args(out))
    assert rc == 0 and "1 of 1 already done, reused" in stdout
    assert snapshot(out / "seed0") == finished


def _sweeps_unfinished_seed(out: Path) -> Path:
    """An output folder as a sweep of `sweep_args` leaves it when killed mid-run: its
    marker, and seed 0's folder with its record and no finished metrics."""
    seed0 = out / "seed0"
    seed0.mkdir(parents=True)
    (out / "sweep.json").write_text(json.dumps({"kind": "sweep"}))
    (seed0 / "sparring_run.json").write_text(json.dumps({"kind": "run"}))
    (seed0 / "study.json").write_text(json.dumps({"args": seed_args(0), "returncode": None}))
    (seed0 / "metrics.jsonl").write_text(json.dumps({"step": 0}) + "\n")
    return seed0


def test_a_seed_folder_a_live_run_holds_is_refused(tmp_path, capsys):
    """A seed folder whose run.lock is held (a trainer still running in it) was deleted
    under the trainer and started again. Now the sweep stops, naming it and the pid."""
    out = tmp_path / "sw"
    seed0 = _sweeps_unfinished_seed(out)
    with RunLock(seed0):
        before = snapshot(out)
        rc, _, err = cli(capsys, *sweep_args(out))
        assert rc == 2
        line = one_line(err)
        assert str(seed0) in line and f"pid {os.getpid()}" in line
        assert snapshot(out) == before


def test_a_second_sweep_into_the_same_output_is_refused(tmp_path, capsys):
    """Two sweeps into one --out at once: the second deleted the first's live run folder.
    Now the first holds OUT/sweep.lock and the second stops at once."""
    out = tmp_path / "sw"
    _sweeps_unfinished_seed(out)
    fd = os.open(out / "sweep.lock", os.O_RDWR | os.O_CREAT)  # as the first sweep holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"{os.getpid()}\n".encode())
        before = snapshot(out)
        rc, _, err = cli(capsys, *sweep_args(out))
        assert rc == 2 and "in use by another sweep" in one_line(err)
        assert snapshot(out) == before
    finally:
        os.close(fd)


def test_an_unfinished_seed_of_the_same_arguments_starts_again(tmp_path, capsys):
    """The sweep's own earlier attempt (same arguments, not finished, not live) is deleted
    and trained again: the one folder the sweep may delete."""
    out = tmp_path / "sw"
    seed0 = _sweeps_unfinished_seed(out)
    assert cli(capsys, *sweep_args(out))[0] == 0
    rec = json.loads((seed0 / "study.json").read_text())
    assert rec["returncode"] == 0 and rec["args"] == seed_args(0)
    assert [json.loads(x)["step"] for x in (seed0 / "metrics.jsonl").read_text().splitlines()
            ] == [1]


def _state(pid: int) -> str | None:
    """The process's state letter (R, S, Z, ...), None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text.rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_sigkill_of_a_sweep_leaves_no_trainer_running(tmp_path):
    """A sweep killed with SIGKILL left its trainer running as an orphan. Now the trainer
    ends with it (it asked the kernel for SIGTERM when its parent dies)."""
    out = tmp_path / "sw"
    env = dict(os.environ, PYTHONPATH=str(SRC))
    args = [str(a) for a in sweep_args(out)]
    args[args.index("train.steps=1")] = "train.steps=100000"  # trains until stopped
    proc = subprocess.Popen([sys.executable, "-m", "sparring", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    trainer = None
    try:
        lock = out / "seed0" / "run.lock"
        deadline = time.monotonic() + 180
        while trainer is None and time.monotonic() < deadline:  # the trainer took its lock
            text = lock.read_text().strip() if lock.exists() else ""
            trainer = int(text) if text.isdigit() else None
            assert proc.poll() is None, "the sweep ended before its trainer started"
            time.sleep(0.2)
        assert trainer is not None and _state(trainer) not in (None, "Z")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        deadline = time.monotonic() + 60
        while _state(trainer) not in (None, "Z") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _state(trainer) in (None, "Z"), "the trainer outlived its sweep"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if trainer is not None and _state(trainer) not in (None, "Z"):
            os.kill(trainer, signal.SIGKILL)


def test_train_run_dir_naming_a_folder_that_is_no_run_is_refused(tmp_path, capsys):
    """`train.run_dir` naming a folder of the user's trained into it (config.yaml,
    metrics, checkpoints among the user's files). Now it is one line, and the folder is
    left as it was; an empty folder and a new one are still fine."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    rc, _, err = cli(capsys, "train", *TINY, f"train.run_dir={mine}")
    assert rc == 2
    line = one_line(err)
    assert "train.run_dir" in line and str(mine) in line
    assert snapshot(mine) == {"notes.txt": b"mine"}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli(capsys, "train", *TINY, f"train.run_dir={empty}")[0] == 0
    assert (empty / "sparring_run.json").is_file() and (empty / "metrics.jsonl").is_file()


def test_the_python_train_refuses_a_folder_that_is_no_run(tmp_path):
    """The same check in `sparring.train.loop.train`, before the folder is locked."""
    from sparring.config import Config
    from sparring.train.loop import train

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.yaml").write_text("not a run's\n")
    with pytest.raises(RuntimeError, match="not a Sparring run folder"):  # NotARunFolderError
        train(Config.load("default", TINY), None, lambda step: [], run_dir=mine)
    assert snapshot(mine) == {"config.yaml": b"not a run's\n"}


def test_a_run_from_before_markers_is_a_run_and_a_look_alike_is_not(tmp_path):
    """Without the marker, only a run's own config.yaml beside its checkpoints counts: a
    folder of another tool's config.yaml and checkpoints/ is refused; a lone run.lock (a
    run that took the lock in an empty folder) is a run's."""
    import yaml

    from sparring.config import Config, to_dict
    from sparring.train.runlock import NotARunFolderError, check_run_dir

    old = tmp_path / "old"
    (old / "checkpoints").mkdir(parents=True)
    (old / "config.yaml").write_text(yaml.safe_dump(to_dict(Config())))
    check_run_dir(old)
    other = tmp_path / "other"
    (other / "checkpoints").mkdir(parents=True)
    (other / "config.yaml").write_text("lr: 0.1\nmodel: resnet\n")
    with pytest.raises(NotARunFolderError, match="not a Sparring run folder"):
        check_run_dir(other)
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "run.lock").write_text("123\n")
    check_run_dir(locked)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotARunFolderError, match="not a folder"):
        check_run_dir(tmp_path / "file")


def test_a_child_whose_starter_is_gone_exits_and_others_ignore_the_variable():
    """`sparring.lifeline`: a child started for a process that has already ended exits at
    once; a variable naming a live process that is not its parent is not for it."""
    from sparring.lifeline import ENV

    code = "from sparring.lifeline import exit_with_parent; exit_with_parent(); print('ran')"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for pid, rc, out in ((gone.pid, 143, ""), (1, 0, "ran\n")):
        env = dict(os.environ, PYTHONPATH=str(SRC), **{ENV: str(pid)})
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=60)
        assert (proc.returncode, proc.stdout) == (rc, out), proc.stderr
