"""Checkpoints: safetensors for tensors, JSON for everything else, written atomically.

A checkpoint is a folder ``RUN/checkpoints/step_000042/`` holding

* ``<name>.safetensors`` for each weights dict given (``model`` or ``adapter``, ...),
* ``state.json`` + ``state.safetensors``: the state of every stateful object (anything
  with ``state_dict``/``load_state_dict``: learner, optimizer, schedule, running
  baselines, opponent pools) and the python / numpy / torch RNG states. Nested
  containers are encoded losslessly (int dict keys, tuples, numpy arrays); tensors go
  to safetensors under their path.

* ``manifest.json``, written last: the size and sha256 of every other file.

Each file is flushed to disk, the folder is written under a temporary name then renamed,
so a kill never leaves a half checkpoint; the manifest catches what a crash cannot
explain (a disk or a copy that garbled a file). `latest_intact_checkpoint` is the newest
checkpoint that passes `verify_checkpoint`. Nothing is unpickled on load.

The manifest is checked, never trusted: ``state.json`` records ``format`` (`FORMAT`), so a
checkpoint of this format without its manifest is damaged, not "older"; a manifest that is
not ``{"files": {name: {"bytes": int, "sha256": hex}}}`` is damaged; and only regular files
directly inside the checkpoint folder are ever opened (`_member`: no absolute or ``../``
names, no link out of the folder, no device or fifo). Pool snapshots get the same treatment
(`write_manifest`, `verify_folder`; `sparring.rollout.snapshots`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import random
import re
import shutil
import stat
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from sparring.train.atomic import atomic_write, atomic_write_text, fsync_dir, fsync_file

log = logging.getLogger(__name__)

CKPT_DIR = "checkpoints"
MANIFEST = "manifest.json"
FORMAT = 2  # "format" in a checkpoint's state.json (a snapshot's marker): it has a manifest
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_OS_ERROR_RE = re.compile(r"os error (\d+)|code: (\d+)")  # how safetensors (Rust) words one
_STEP_RE = re.compile(r"^step_(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint file that is missing, torn or corrupted (the message names it)."""


# ---------------------------------------------------------------- lossless encoding


def encode(obj: Any, tensors: dict[str, Tensor], path: str = "") -> Any:
    """JSON-able form of ``obj``; tensors are moved into ``tensors`` under their path."""
    if isinstance(obj, Tensor):
        key = path or "value"
        tensors[key] = obj.detach().to("cpu", copy=True).contiguous()
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        key = path or "value"
        tensors[key] = torch.from_numpy(np.ascontiguousarray(obj).copy())
        return {"__ndarray__": key}
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) for k in obj) and "__items__" not in obj:
            return {k: encode(v, tensors, f"{path}.{k}" if path else k) for k, v in obj.items()}
        return {"__items__": [[encode(k, tensors, f"{path}.k{i}"),
                               encode(v, tensors, f"{path}.{i}")]
                              for i, (k, v) in enumerate(obj.items())]}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot checkpoint {type(obj).__name__} at {path or 'top level'!r}")


def decode(obj: Any, tensors: Mapping[str, Tensor]) -> Any:
    if isinstance(obj, list):
        return [decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        return tensors[obj["__tensor__"]]
    if "__ndarray__" in obj:
        return tensors[obj["__ndarray__"]].numpy()
    if "__tuple__" in obj:
        return tuple(decode(v, tensors) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {decode(k, tensors): decode(v, tensors) for k, v in obj["__items__"]}
    return {k: decode(v, tensors) for k, v in obj.items()}


# ---------------------------------------------------------------- RNG states


class RNGState:
    """python ``random``, numpy's global generator, torch CPU (and CUDA) generators."""

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                               "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            out["cuda"] = torch.cuda.get_rng_state_all()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Snapshot:
    """An object's state frozen now: `encode`d, so it shares nothing with the live object,
    which may go on changing. Stateful itself, so it can be checkpointed in its place."""

    def __init__(self, obj: Any):
        self.tensors: dict[str, Tensor] = {}
        self.doc = encode(obj.state_dict(), self.tensors)

    def state_dict(self) -> Any:
        return decode(self.doc, self.tensors)


# ---------------------------------------------------------------- save / load


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


def step_dirs(run_dir: str | Path) -> list[tuple[int, Path]]:
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if p.is_dir() and (m := _STEP_RE.match(p.name))]
    return sorted(found)


def tidy_checkpoints(run_dir: str | Path) -> None:
    """Clean up after a save that was killed: remove its temporary folder, and put back a
    step it was replacing (``.old-step_N-*`` with no ``step_N``). Call it only while
    holding the run's lock (`sparring.train.runlock`)."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return
    for p in sorted(root.iterdir()):
        if p.name.startswith(".tmp-step_"):
            shutil.rmtree(p, ignore_errors=True)
        elif p.name.startswith(".old-step_"):
            final = root / p.name[len(".old-"):].rsplit("-", 1)[0]
            if final.exists():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.rename(final)
                log.warning("put back %s, whose replacement was interrupted", final)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    dirs = step_dirs(run_dir)
    return dirs[-1][1] if dirs else None


def save_checkpoint(run_dir: str | Path, step: int, *, weights: Mapping[str, Mapping[str, Tensor]],
                    stateful: Mapping[str, Any], meta: Mapping[str, Any] | None = None,
                    keep: int | None = None, protect: int | None = None) -> Path:
    """Write checkpoint ``step`` atomically; keep only the last ``keep`` checkpoints, and
    step ``protect`` besides (the best one, `sparring.train.best`)."""
    root = Path(run_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for name, tensors in weights.items():
            write_tensors(tmp / f"{name}.safetensors", tensors)
        tensors: dict[str, Tensor] = {}
        states = {name: encode(obj.state_dict(), tensors, name) for name, obj in stateful.items()}
        write_tensors(tmp / "state.safetensors", tensors)
        doc = {"format": FORMAT, "step": step, "meta": dict(meta or {}),
               "weights": sorted(weights), "state": states}
        atomic_write_text(tmp / "state.json", json.dumps(doc, allow_nan=True))
        write_manifest(tmp)
        if final.exists():  # re-saving a step (e.g. a crash right after a periodic save)
            old = root / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep is not None:
        for old_step, old_dir in step_dirs(run_dir)[:-keep]:
            if old_step != protect:
                shutil.rmtree(old_dir, ignore_errors=True)
    return final


def _plain(name: Any) -> bool:
    """Whether ``name`` is a plain file name (no folder part, not ``.`` or ``..``)."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name
            and "\0" not in name)


def _member(folder: Path, name: Any) -> Path:
    """``folder/name``, checked before anything opens it: ``name`` is a plain file name and
    the path (links followed) is a regular file inside ``folder``. `CheckpointError` naming
    the problem otherwise (missing; an absolute or ``../`` name; a link out of the folder; a
    device, fifo or folder, which could hang a read or read what the checkpoint does not
    hold)."""
    if not _plain(name):
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
    path = _member(folder, marker)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    return isinstance(doc, dict) and "format" in doc


def _manifest(folder: Path, marker: str = "state.json") -> dict[str, Any] | None:
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
    _member(folder, MANIFEST)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        files = doc.get("files") if isinstance(doc, dict) else None
        if not isinstance(files, dict):
            raise TypeError("not {'files': {name: entry}}")
        for name, entry in files.items():
            if not _plain(name):
                raise ValueError(f"{name!r} is not a file name inside the folder")
            if not (isinstance(entry, dict) and type(entry.get("bytes")) is int
                    and entry["bytes"] >= 0 and isinstance(entry.get("sha256"), str)
                    and _SHA256_RE.match(entry["sha256"])):
                raise TypeError(f"entry {name!r} is not {{'bytes': int, 'sha256': hex digest}}")
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: not a valid manifest ({e})") from None
    return files


def _check_file(ckpt: Path, name: str, files: Mapping[str, Any] | None) -> Path:
    """``ckpt/name``, a regular file inside ``ckpt`` (`_member`) with (given the manifest's
    ``files``) its recorded size and sha256."""
    path = _member(ckpt, name)
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
    """Check every file ``folder``'s manifest lists (`_check_file`) and return the manifest's
    files; None, with a warning, for a folder written before manifests (see `_manifest`)."""
    folder = Path(folder)
    files = _manifest(folder, marker)
    if files is None:
        log.warning("%s has no %s (written by an older sparring): its files are not checked "
                    "against checksums", folder, MANIFEST)
    else:
        for name in files:
            _check_file(folder, name, files)
    return files


def _read_doc(ckpt: Path) -> dict[str, Any]:
    path = _member(ckpt, "state.json")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not (isinstance(doc, dict) and isinstance(doc.get("step"), int)
            and isinstance(doc.get("state"), dict)):
        raise CheckpointError(f"{path}: not a checkpoint state (no integer 'step' or no 'state')")
    if not (isinstance(doc.get("weights", []), list)
            and all(isinstance(w, str) for w in doc.get("weights", []))):
        raise CheckpointError(f"{path}: 'weights' is not a list of names")
    return doc


def verify_checkpoint(ckpt: str | Path) -> None:
    """Raise `CheckpointError` naming the first problem with ``ckpt``: a malformed or missing
    manifest (see `_manifest`), a file missing from the checkpoint or differing from the
    manifest, a name that leads out of the folder or to no regular file (`_member`), a
    required file the manifest does not list, or a ``state.json`` / safetensors header that
    does not parse. A checkpoint written before manifests (no ``format`` in its
    ``state.json``) gets the other checks, with a warning."""
    ckpt = Path(ckpt)
    files = verify_folder(ckpt, "state.json")
    doc = _read_doc(ckpt)
    weights = [f"{name}.safetensors" for name in doc.get("weights", [])]
    for name in ["state.json", "state.safetensors", *weights]:
        path = _member(ckpt, name)
        if files is not None and name not in files:
            raise CheckpointError(f"{path} is not in {ckpt / MANIFEST}")
        if name.endswith(".safetensors"):
            try:
                with safe_open(str(path), "pt"):
                    pass
            except (SafetensorError, OSError) as e:
                raise CheckpointError(f"{path}: not a readable safetensors file ({e})") \
                    from None


def latest_intact_checkpoint(run_dir: str | Path, *, set_aside: bool = False,
                             warn: bool = True) -> Path | None:
    """The newest checkpoint of ``run_dir`` that passes `verify_checkpoint`, warning about
    each newer one skipped and why (unless ``warn`` is off; ``set_aside``: renamed
    ``corrupt-step_N`` too, so a new save of that step does not delete it). None when the
    run has no checkpoint at all; a `CheckpointError` when it has some and none is intact."""
    skipped = []
    for _, ckpt in reversed(step_dirs(run_dir)):
        try:
            verify_checkpoint(ckpt)
            return ckpt
        except CheckpointError as e:
            note = ""
            if set_aside:
                aside = ckpt.with_name(f"corrupt-{ckpt.name}-{uuid.uuid4().hex[:8]}")
                ckpt.rename(aside)
                note = f" (moved to {aside.name})"
            skipped.append(f"{ckpt.name}: {e}")
            if warn:
                log.warning("skipping checkpoint %s%s: %s", ckpt, note, e)
    if skipped:
        raise CheckpointError(f"{run_dir} has no intact checkpoint ({'; '.join(skipped)})")
    return None


def load_weights(ckpt: str | Path, name: str, *, verify: bool = True) -> dict[str, Tensor]:
    """The weights dict ``name`` of ``ckpt``, checked against its manifest (``verify``); only
    a regular file inside ``ckpt`` is read (`_member`)."""
    ckpt, file = Path(ckpt), f"{name}.safetensors"
    if _plain(file) and not os.path.lexists(ckpt / file):
        raise FileNotFoundError(f"checkpoint {ckpt} has no weights {name!r} ({file})")
    return read_tensors(_check_file(ckpt, file, _manifest(ckpt) if verify else None))


def load_checkpoint(ckpt: str | Path, stateful: Mapping[str, Any],
                    strict: bool = True, *, verify: bool = True) -> dict[str, Any]:
    """Restore every object of ``stateful`` from ``ckpt``; returns the JSON document.

    Everything is read (and with ``verify`` checked against the manifest) before any object
    is touched, so a bad file raises `CheckpointError` with the objects as they were.
    ``strict``: an object in ``stateful`` that the checkpoint does not hold is an error,
    unless the object says it may start afresh (a true ``restore_optional`` attribute: state
    added in a later version that only a report reads, e.g. the evaluation's strategy
    history); such an object keeps its fresh state.
    """
    ckpt = Path(ckpt)
    files = _manifest(ckpt) if verify else None
    _check_file(ckpt, "state.json", files)
    doc = _read_doc(ckpt)
    tensors = read_tensors(_check_file(ckpt, "state.safetensors", files))
    missing = [k for k in stateful if k not in doc["state"]
               and not getattr(stateful[k], "restore_optional", False)]
    if missing and strict:
        raise KeyError(f"checkpoint {ckpt} holds no state for {missing}; "
                       f"it has {sorted(doc['state'])}")
    try:
        states = {name: decode(doc["state"][name], tensors) for name in stateful
                  if name in doc["state"]}
    except KeyError as e:
        raise CheckpointError(f"{ckpt / 'state.safetensors'} lacks tensor {e} that "
                              "state.json refers to") from None
    for name, state in states.items():
        stateful[name].load_state_dict(state)
    return doc
