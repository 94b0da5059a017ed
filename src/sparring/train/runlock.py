"""One training process per run folder (``RUN/run.lock``), and which folders are runs
(``RUN/sparring_run.json``).

The lock is an exclusive ``flock`` on ``RUN/run.lock``, which holds the owner's pid (for
the error message). Taking it is atomic, and the kernel drops it when the owner exits
however it exits, so a lock left by a killed run is stale by construction: the next run
takes it over and says so. `RunLock.release` removes the file. A run that finds the lock
held fails at once with `RunLockedError`, naming the folder and the owner's pid.
`lock_holder` asks whether a folder's lock is held without taking it (``sparring sweep``
leaves a live run alone), and the same lock on another file serves other owners
(``OUT/sweep.lock``: one sweep per output folder).

A fresh run creates its folder with the marker `RUN_MARKER` (`claim_run_dir`), and trains
only into a folder that is new, empty, or already a Sparring run (the marker, or the
run's ``config.yaml`` and its checkpoints or metrics, for a run from before markers): a
folder of anyone else's is refused with `NotARunFolderError` and left as it was.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_FILE = "run.lock"
RUN_MARKER = "sparring_run.json"


class RunLockedError(RuntimeError):
    """Another process is training in this run folder (or holds the lock taken)."""


class NotARunFolderError(RuntimeError):
    """A folder that holds something other than a Sparring run; the message is one line."""


def write_run_marker(run_dir: str | Path) -> Path:
    """Mark ``run_dir`` (an existing folder) as a Sparring run folder."""
    from sparring.storage.atomic import atomic_write_text

    path = Path(run_dir) / RUN_MARKER
    atomic_write_text(path, json.dumps({"format": 1, "kind": "run", "created":
                                        time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
    return path


def is_run_folder(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` is a Sparring run folder: it has the marker, or it is a run from
    before markers (a ``config.yaml`` holding a run's ``model``, ``algorithm`` and
    ``train`` sections, beside ``checkpoints/`` or ``metrics.jsonl``)."""
    run = Path(run_dir)
    if (run / RUN_MARKER).is_file():
        return True
    if not ((run / "config.yaml").is_file() and ((run / "checkpoints").is_dir()
                                                 or (run / "metrics.jsonl").is_file())):
        return False
    from sparring.config import read_yaml

    try:
        data = read_yaml(run / "config.yaml")
    except Exception:  # not a config at all
        return False
    return isinstance(data, dict) and {"model", "algorithm", "train"} <= set(data)


def check_run_dir(run_dir: str | Path) -> None:
    """`NotARunFolderError` (one line) when a fresh run may not use ``run_dir``: it exists
    and is not a folder, or it holds files and is no Sparring run (`is_run_folder`; a
    lone ``run.lock`` is a run's, taken in an empty folder)."""
    run = Path(run_dir)
    if not os.path.lexists(run):
        return
    if not run.is_dir():
        raise NotARunFolderError(f"train.run_dir: {run} exists and is not a folder; pick "
                                 "another train.run_dir")
    if is_run_folder(run) or all(p.name == LOCK_FILE for p in run.iterdir()):
        return
    raise NotARunFolderError(
        f"train.run_dir: {run} holds files and is not a Sparring run folder (no "
        f"{RUN_MARKER}); nothing was written to it: pick another train.run_dir")


def claim_run_dir(run_dir: str | Path) -> Path:
    """Create ``run_dir`` (and its parents) with the run marker, or take an existing empty
    folder or Sparring run (`check_run_dir` refuses anything else, untouched)."""
    run = Path(run_dir)
    check_run_dir(run)
    run.mkdir(parents=True, exist_ok=True)
    if not (run / RUN_MARKER).is_file():
        write_run_marker(run)
    return run


def lock_holder(run_dir: str | Path, file: str = LOCK_FILE) -> str | None:
    """The pid (as written, '?' if unreadable) of the live process holding ``run_dir``'s
    lock, None when nobody holds it. Creates nothing; a shared lock is taken for an instant
    (a run starting at that instant fails with `RunLockedError`, as for any holder)."""
    try:
        fd = os.open(Path(run_dir) / file, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(fd) or "?"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class RunLock:
    """``with RunLock(run_dir):`` holds the run folder's lock for the block; ``file`` and
    ``message`` serve other owners (``message`` formatted with ``folder`` and ``pid``)."""

    def __init__(self, run_dir: str | Path, file: str = LOCK_FILE,
                 message: str = "{folder} is in use by another training run (pid {pid}); "
                 "wait for it to finish, or pick another train.run_dir"):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / file
        self.message = message
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this RunLock")
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _read_pid(fd)
                os.close(fd)
                raise RunLockedError(self.message.format(folder=self.run_dir, pid=owner)) \
                    from None
            # the owner may have released (and unlinked) the file between our open and
            # flock: then we hold a lock on a file nobody else will open; try again
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        stale = _read_pid(fd)
        if stale:
            log.warning("%s: taking over the lock left by pid %s, which is no longer running",
                        self.run_dir, stale)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still locked, so no one else's file
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> str:
    """The pid written in the lock file ('' when empty, '?' when unreadable)."""
    try:
        text = os.pread(fd, 64, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return "?"
    return text if text.isdigit() or not text else "?"
