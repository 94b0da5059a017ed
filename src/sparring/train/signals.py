"""SIGTERM handled like Ctrl-C while a run trains.

``timeout``, Docker, Slurm and Kubernetes stop a process with SIGTERM, whose default action
ends Python at once: no crash checkpoint, no message. While `sparring.train.loop.train` or
`resume` runs (in the main thread, where no other handler was installed), SIGTERM raises
`Terminated`, a `KeyboardInterrupt`, wherever the run is; the loop then does what it does
for Ctrl-C (a crash checkpoint of the last finished step, docs/reliability.md) and the
command line exits with 143 (128 + SIGTERM) and a line saying what was kept.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated("terminated (SIGTERM)")


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises `Terminated`; the previous handler comes back after.
    A no-op outside the main thread or when the process already handles SIGTERM."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = ["Terminated", "sigterm_as_interrupt"]
