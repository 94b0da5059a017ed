"""Crash-safe file writes: a file is either its old content or its new one, never a mix.

`atomic_write` writes to a temporary sibling, flushes it to disk (``fsync``), renames it
over the target and syncs the folder, so the rename itself survives a power cut. Every
file a run writes goes through it (config, reference weights, metrics rewrites, the
files of a checkpoint), except ``metrics.jsonl``'s appends (see `sparring.train.metrics`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path


def fsync_file(path: str | Path) -> None:
    """Flush ``path``'s data to disk (for files written by someone else's writer)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    """Flush a folder's entries (renames, new files) to disk."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync on folders
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Create or replace ``path`` with what ``write(tmp)`` writes to the temporary path
    ``tmp``; on any error ``path`` is left as it was and ``tmp`` is removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        write(tmp)
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """`atomic_write` of a UTF-8 text."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """`atomic_write` of raw bytes."""
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))
