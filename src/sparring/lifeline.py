"""A child process that ends with its parent: ``sparring sweep`` (and the studies' grids)
start each ``sparring train`` with `child_env`, and the child calls `exit_with_parent` as
it starts, so a sweep killed however it is killed (SIGKILL included, which it cannot
handle) leaves no trainer running on its own.

The child asks the kernel for SIGTERM when its parent dies (Linux's
``prctl(PR_SET_PDEATHSIG)``; elsewhere a thread polls the parent's pid once a second).
SIGTERM ends a training run as Ctrl-C does (`sparring.train.signals`: a crash checkpoint
where one is exact), and a process still starting up simply exits. The variable is read
once and removed, so the child's own children do not inherit it; a process whose parent is
not the one named (a script between the sweep and the trainer) ignores it, unless that
process is gone, and then it exits at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

ENV = "SPARRING_EXIT_WITH_PID"
PR_SET_PDEATHSIG = 1


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) for a child that must end with this process."""
    return dict(os.environ if env is None else env, **{ENV: str(os.getpid())})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ask_kernel() -> bool:
    """Ask Linux for SIGTERM when the parent dies; False where that cannot be done."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


def _gone(parent: int) -> None:
    print(f"sparring: the process that started this one (pid {parent}) has ended; exiting",
          file=sys.stderr, flush=True)
    os._exit(143)


def exit_with_parent() -> None:
    """If this process was started with `child_env`, end it when that parent ends (see
    the module doc); a no-op otherwise."""
    value = os.environ.pop(ENV, "")
    if not value.isdigit():
        return
    parent = int(value)
    if os.getppid() != parent:
        if _alive(parent):
            return  # the variable was meant for a process between us
        _gone(parent)  # the parent died before we could ask to follow it
    if not _ask_kernel():
        threading.Thread(target=_watch, args=(parent,), name="exit-with-parent",
                         daemon=True).start()
    if os.getppid() != parent:  # it died between the first check and the request
        _gone(parent)


__all__ = ["ENV", "child_env", "exit_with_parent"]
