"""One training process per run folder: ``RUN/run.lock``.

The lock is an exclusive ``flock`` on ``RUN/run.lock``, which holds the owner's pid (for
the error message). Taking it is atomic, and the kernel drops it when the owner exits
however it exits, so a lock left by a killed run is stale by construction: the next run
takes it over and says so. `RunLock.release` removes the file. A run that finds the lock
held fails at once with `RunLockedError`, naming the folder and the owner's pid.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_FILE = "run.lock"


class RunLockedError(RuntimeError):
    """Another process is training in this run folder."""


class RunLock:
    """``with RunLock(run_dir):`` holds the run folder's lock for the block."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
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
                raise RunLockedError(
                    f"{self.run_dir} is in use by another training run (pid {owner}); wait "
                    "for it to finish, or pick another train.run_dir") from None
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
