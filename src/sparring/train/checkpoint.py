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

The manifest is checked, never trusted (`sparring.storage.folders`: a checkpoint whose
``state.json`` records ``format`` must have one; only regular files inside the folder are
opened).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from sparring.storage.atomic import atomic_write_text, fsync_dir
from sparring.storage.bounded import FileLimitError, read_json_bounded
from sparring.storage.folders import (
    CKPT_DIR,
    FORMAT,
    MANIFEST,
    CheckpointError,
    check_file,
    member_file,
    plain_name,
    read_manifest,
    read_tensors,
    step_dirs,
    verify_folder,
    write_manifest,
    write_tensors,
)

log = logging.getLogger(__name__)


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


class FrozenState:
    """An object's state frozen now: `encode`d, so it shares nothing with the live object,
    which may go on changing. Stateful itself, so it can be checkpointed in its place."""

    def __init__(self, obj: Any):
        self.tensors: dict[str, Tensor] = {}
        self.doc = encode(obj.state_dict(), self.tensors)

    def state_dict(self) -> Any:
        return decode(self.doc, self.tensors)


# ---------------------------------------------------------------- save / load


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


def _read_doc(ckpt: Path) -> dict[str, Any]:
    path = member_file(ckpt, "state.json")
    try:
        doc = read_json_bounded(path, what="checkpoint state")
    except FileLimitError as e:
        raise CheckpointError(str(e)) from None
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
    manifest (see `read_manifest`), a file missing from the checkpoint or differing from the
    manifest, a name that leads out of the folder or to no regular file (`member_file`), a
    required file the manifest does not list, or a ``state.json`` / safetensors header that
    does not parse. A checkpoint written before manifests (no ``format`` in its
    ``state.json``) gets the other checks, with a warning."""
    ckpt = Path(ckpt)
    files = verify_folder(ckpt, "state.json")
    doc = _read_doc(ckpt)
    weights = [f"{name}.safetensors" for name in doc.get("weights", [])]
    for name in ["state.json", "state.safetensors", *weights]:
        path = member_file(ckpt, name)
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
    a regular file inside ``ckpt`` is read (`member_file`)."""
    ckpt, file = Path(ckpt), f"{name}.safetensors"
    if plain_name(file) and not os.path.lexists(ckpt / file):
        raise FileNotFoundError(f"checkpoint {ckpt} has no weights {name!r} ({file})")
    return read_tensors(check_file(ckpt, file, read_manifest(ckpt) if verify else None))


def checkpoint_meta(ckpt: str | Path) -> dict[str, Any]:
    """The ``meta`` that ``ckpt`` was saved with (`save_checkpoint`)."""
    return dict(_read_doc(Path(ckpt)).get("meta") or {})


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
    files = read_manifest(ckpt) if verify else None
    check_file(ckpt, "state.json", files)
    doc = _read_doc(ckpt)
    tensors = read_tensors(check_file(ckpt, "state.safetensors", files))
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
