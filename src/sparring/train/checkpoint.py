"""Checkpoints: safetensors for tensors, JSON for everything else, written atomically.

A checkpoint is a folder ``RUN/checkpoints/step_000042/`` holding

* ``<name>.safetensors`` for each weights dict given (``model`` or ``adapter``, ...),
* ``state.json`` + ``state.safetensors``: the state of every stateful object (anything
  with ``state_dict``/``load_state_dict``: learner, optimizer, schedule, running
  baselines, opponent pools) and the python / numpy / torch RNG states. Nested
  containers are encoded losslessly (int dict keys, tuples, numpy arrays); tensors go
  to safetensors under their path.

Written to a temporary folder then renamed, so a kill never leaves a half checkpoint.
Nothing is unpickled on load.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

CKPT_DIR = "checkpoints"
_STEP_RE = re.compile(r"^step_(\d+)$")


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


# ---------------------------------------------------------------- save / load


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_tensors(path: Path, tensors: Mapping[str, Tensor]) -> None:
    # copies break storage sharing (tied embeddings), which safetensors refuses
    save_file({k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()},
              str(path))


def step_dirs(run_dir: str | Path) -> list[tuple[int, Path]]:
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if p.is_dir() and (m := _STEP_RE.match(p.name))]
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    dirs = step_dirs(run_dir)
    return dirs[-1][1] if dirs else None


def save_checkpoint(run_dir: str | Path, step: int, *, weights: Mapping[str, Mapping[str, Tensor]],
                    stateful: Mapping[str, Any], meta: Mapping[str, Any] | None = None,
                    keep: int | None = None) -> Path:
    """Write checkpoint ``step`` atomically; keep only the last ``keep`` checkpoints."""
    root = Path(run_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for name, tensors in weights.items():
            _write_tensors(tmp / f"{name}.safetensors", tensors)
        tensors: dict[str, Tensor] = {}
        states = {name: encode(obj.state_dict(), tensors, name) for name, obj in stateful.items()}
        _write_tensors(tmp / "state.safetensors", tensors)
        doc = {"step": step, "meta": dict(meta or {}), "weights": sorted(weights), "state": states}
        with open(tmp / "state.json", "w", encoding="utf-8") as f:
            json.dump(doc, f, allow_nan=True)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        if final.exists():  # re-saving a step (e.g. a crash right after a periodic save)
            old = root / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep is not None:
        for _, old_dir in step_dirs(run_dir)[:-keep]:
            shutil.rmtree(old_dir, ignore_errors=True)
    return final


def load_weights(ckpt: str | Path, name: str) -> dict[str, Tensor]:
    path = Path(ckpt) / f"{name}.safetensors"
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {ckpt} has no weights {name!r} ({path.name})")
    return load_file(str(path), device="cpu")


def load_checkpoint(ckpt: str | Path, stateful: Mapping[str, Any],
                    strict: bool = True) -> dict[str, Any]:
    """Restore every object of ``stateful`` from ``ckpt``; returns the JSON document.

    ``strict``: an object in ``stateful`` that the checkpoint does not hold is an error.
    """
    ckpt = Path(ckpt)
    with open(ckpt / "state.json", encoding="utf-8") as f:
        doc = json.load(f)
    tensors = load_file(str(ckpt / "state.safetensors"), device="cpu")
    missing = [k for k in stateful if k not in doc["state"]]
    if missing and strict:
        raise KeyError(f"checkpoint {ckpt} holds no state for {missing}; "
                       f"it has {sorted(doc['state'])}")
    for name, obj in stateful.items():
        if name in doc["state"]:
            obj.load_state_dict(decode(doc["state"][name], tensors))
    return doc
