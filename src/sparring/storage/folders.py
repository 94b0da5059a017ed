"""Folders whose files are checked before they are read: safetensors files written
atomically, and a ``manifest.json`` (written last) with the size and sha256 of every other
file.

The manifest is checked, never trusted: a folder whose marker file (a checkpoint's
``state.json``, a pool snapshot's ``snapshot.json``) records ``format`` (`FORMAT`) and has
no manifest is damaged, not "older"; a manifest that is not ``{"files": {name: {"bytes":
int, "sha256": hex}}}`` is damaged; and only regular files directly inside the folder are
ever opened (`member_file`: no absolute or ``../`` names, no link out of the folder, no
device or fifo). Run checkpoints (`sparring.train.checkpoint`) and the league's snapshots
(`sparring.rollout.snapshots`) are such folders.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from sparring.storage.atomic import atomic_write, atomic_write_text, fsync_file
from sparring.storage.bounded import FileLimitError, read_json_bounded

log = logging.getLogger(__name__)

CKPT_DIR = "checkpoints"  # a run's checkpoints: RUN/checkpoints/step_000042/
MANIFEST = "manifest.json"
FORMAT = 2  # "format" in a folder's marker file (state.json, snapshot.json): it has a manifest
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_STEP_RE = re.compile(r"^step_(\d+)$")
_OS_ERROR_RE = re.compile(r"os error (\d+)|code: (\d+)")  # how safetensors (Rust) words one


class CheckpointError(ValueError):
    """A checkpoint file that is missing, torn or corrupted (the message names it)."""


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def storage_error(e: SafetensorError, path: str | Path) -> OSError | None:
    """The `OSError` naming ``path`` behind safetensors' error ``e`` writing it, when it is
    a storage error: its errno ("No space left on device (os error 28)": ``ENOSPC``), else
    ``EIO`` with safetensors' message; None for any other error. So a full disk is one
    kind of error (one line in the CLI) wherever it happens."""
    text = str(e)
    m = _OS_ERROR_RE.search(text)
    code = int(m.group(1) or m.group(2)) if m else (
        errno.ENOSPC if "No space left" in text else None)
    if code is not None:
        return OSError(code, os.strerror(code), str(path))
    if "I/O error" in text or "IoError" in text:
        return OSError(errno.EIO, text, str(path))
    return None


def write_tensors(path: str | Path, tensors: Mapping[str, Tensor]) -> Path:
    """Save ``tensors`` to the safetensors file ``path`` with `atomic_write`; a storage
    error (a full disk) is the `OSError` it stands for (`storage_error`), naming ``path``."""
    # copies break storage sharing (tied embeddings), which safetensors refuses
    cpu = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}
    try:
        return atomic_write(path, lambda tmp: save_file(cpu, str(tmp)))
    except SafetensorError as e:
        raise (storage_error(e, path) or e) from e


def write_manifest(folder: str | Path) -> Path:
    """Write ``folder/manifest.json`` atomically: the size and sha256 of every other file of
    the (flat) folder, each flushed to disk first. Written last, after every file it lists."""
    folder = Path(folder)
    listed = [p for p in sorted(folder.iterdir()) if p.name != MANIFEST and p.is_file()]
    for p in listed:
        fsync_file(p)  # (someone else's writer may not have)
    files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in listed}
    return atomic_write_text(folder / MANIFEST, json.dumps({"files": files}, indent=1))


def read_tensors(path: str | Path) -> dict[str, Tensor]:
    """The tensors of a safetensors file; a torn or garbled file is a `CheckpointError`."""
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None


def plain_name(name: Any) -> bool:
    """Whether ``name`` is a plain file name (no folder part, not ``.`` or ``..``)."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name
            and "\0" not in name)


def member_file(folder: Path, name: Any) -> Path:
    """``folder/name``, checked before anything opens it: ``name`` is a plain file name and
    the path (links followed) is a regular file inside ``folder``. `CheckpointError` naming
    the problem otherwise (missing; an absolute or ``../`` name; a link out of the folder; a
    device, fifo or folder, which could hang a read or read what the checkpoint does not
    hold)."""
    if not plain_name(name):
        raise CheckpointError(f"{folder}: {name!r} is not a file name inside the folder")
    path = folder / name
    try:
        if not path.resolve().is_relative_to(folder.resolve()):
            raise CheckpointError(f"{path} links outside {folder} (to {path.resolve()})")
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing") from None
    except (OSError, RuntimeError) as e:  # a link loop, a name too long ...
        raise CheckpointError(f"{path}: cannot be read ({e})") from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{path} is not a regular file")
    return path


def _has_format(folder: Path, marker: str) -> bool:
    """Whether ``folder``'s JSON file ``marker`` records a ``format``: written with a
    manifest (False when ``marker`` is absent)."""
    if not os.path.lexists(folder / marker):
        return False
    path = member_file(folder, marker)
    try:
        doc = read_json_bounded(path, what=marker)
    except FileLimitError as e:
        raise CheckpointError(str(e)) from None
    except ValueError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    return isinstance(doc, dict) and "format" in doc


def read_manifest(folder: Path, marker: str = "state.json") -> dict[str, Any] | None:
    """The ``files`` of ``folder``'s manifest, each entry a plain name with an int ``bytes``
    and a sha256; None for a folder written before manifests (its ``marker`` file records no
    ``format``). A missing manifest that ``marker`` promises, or a malformed one, is a
    `CheckpointError` naming it."""
    path = folder / MANIFEST
    if not os.path.lexists(path):
        if _has_format(folder, marker):
            raise CheckpointError(f"{path} is missing ({marker} says the folder was written "
                                  "with one)")
        return None
    member_file(folder, MANIFEST)
    try:
        doc = read_json_bounded(path, what="manifest")
        files = doc.get("files") if isinstance(doc, dict) else None
        if not isinstance(files, dict):
            raise TypeError("not {'files': {name: entry}}")
        for name, entry in files.items():
            if not plain_name(name):
                raise ValueError(f"{name!r} is not a file name inside the folder")
            if not (isinstance(entry, dict) and type(entry.get("bytes")) is int
                    and entry["bytes"] >= 0 and isinstance(entry.get("sha256"), str)
                    and _SHA256_RE.match(entry["sha256"])):
                raise TypeError(f"entry {name!r} is not {{'bytes': int, 'sha256': hex digest}}")
    except FileLimitError as e:
        raise CheckpointError(str(e)) from None
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: not a valid manifest ({e})") from None
    return files


def check_file(ckpt: Path, name: str, files: Mapping[str, Any] | None) -> Path:
    """``ckpt/name``, a regular file inside ``ckpt`` (`member_file`) with (given the manifest's
    ``files``) its recorded size and sha256."""
    path = member_file(ckpt, name)
    if files is None:
        return path
    if name not in files:
        raise CheckpointError(f"{path} is not in {ckpt / MANIFEST}")
    want = files[name]
    size = path.stat().st_size
    if size != want["bytes"]:
        raise CheckpointError(f"{path} has {size} bytes, the manifest says {want['bytes']} "
                              "(truncated or overwritten)")
    if sha256_file(path) != want["sha256"]:
        raise CheckpointError(f"{path} does not match its sha256 in the manifest (corrupted)")
    return path


def verify_folder(folder: str | Path, marker: str) -> dict[str, Any] | None:
    """Check every file ``folder``'s manifest lists (`check_file`) and return the manifest's
    files; None, with a warning, for a folder written before manifests (see `read_manifest`)."""
    folder = Path(folder)
    files = read_manifest(folder, marker)
    if files is None:
        log.warning("%s has no %s (written by an older sparring): its files are not checked "
                    "against checksums", folder, MANIFEST)
    else:
        for name in files:
            check_file(folder, name, files)
    return files


def step_dirs(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of each checkpoint folder of ``run_dir``, by step."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if p.is_dir() and (m := _STEP_RE.match(p.name))]
    return sorted(found)
