"""Checkpoints: lossless state encoding, RNG round trip, atomic writes, keep-last-K, and
manifests that are checked, never trusted."""

import json
import math
import os
import random

import numpy as np
import pytest
import torch

from sparring.storage.folders import MANIFEST, CheckpointError, sha256_file, step_dirs
from sparring.train.checkpoint import (
    RNGState,
    latest_checkpoint,
    latest_intact_checkpoint,
    load_checkpoint,
    load_weights,
    save_checkpoint,
    verify_checkpoint,
)
from tests.helpers import deadline


class Box:
    """A stateful object holding whatever state it is given."""

    def __init__(self, state=None):
        self.state = state

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.state = state


class Broken:
    def state_dict(self):
        raise RuntimeError("disk on fire")


NESTED = {
    "ints": {0: 1.5, 7: [1, 2]},  # int keys (an optimizer's state)
    "tuple": (1, (2.0, "x"), None),
    "floats": [math.inf, -0.0, 0.1 + 0.2],
    "array": np.arange(6, dtype=np.uint32).reshape(2, 3),
    "t16": torch.tensor([1.5, -2.25], dtype=torch.bfloat16),
    "tbool": torch.tensor([True, False]),
    "scalar": torch.tensor(3.0),
    "ema": {"tictactoe/0": 0.25, "kuhn/1": -0.5},
}


def test_nested_state_round_trips_losslessly(tmp_path):
    box = Box(NESTED)
    ck = save_checkpoint(tmp_path, 3, weights={"model": {"w": torch.ones(2, 2)}},
                         stateful={"box": box}, meta={"note": "hi"})
    back = Box()
    doc = load_checkpoint(ck, {"box": back})
    s = back.state
    assert doc["step"] == 3 and doc["meta"] == {"note": "hi"}
    assert s["ints"] == {0: 1.5, 7: [1, 2]} and s["tuple"] == (1, (2.0, "x"), None)
    assert s["floats"][0] == math.inf and math.copysign(1, s["floats"][1]) == -1
    assert s["floats"][2] == 0.1 + 0.2
    assert s["array"].dtype == np.uint32 and s["array"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert s["t16"].dtype == torch.bfloat16 and s["t16"].tolist() == [1.5, -2.25]
    assert s["tbool"].tolist() == [True, False] and s["scalar"].shape == ()
    assert s["ema"] == {"tictactoe/0": 0.25, "kuhn/1": -0.5}
    assert load_weights(ck, "model")["w"].tolist() == [[1.0, 1.0], [1.0, 1.0]]
    with pytest.raises(FileNotFoundError, match="no weights 'adapter'"):
        load_weights(ck, "adapter")
    with pytest.raises(KeyError, match="holds no state for \\['other'\\]"):
        load_checkpoint(ck, {"other": Box()})
    # nothing is pickled: the JSON is plain
    assert json.loads((ck / "state.json").read_text())["state"]["box"]["ints"]["__items__"]


def test_rng_states_round_trip(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    ck = save_checkpoint(tmp_path, 1, weights={}, stateful={"rng": RNGState()})
    expected = (random.random(), np.random.rand(), torch.rand(3).tolist())
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    load_checkpoint(ck, {"rng": RNGState()})
    assert (random.random(), np.random.rand(), torch.rand(3).tolist()) == expected


def test_keep_last_k_and_failed_save_leaves_nothing(tmp_path):
    for step in (2, 4, 6, 8):
        save_checkpoint(tmp_path, step, weights={}, stateful={"b": Box({"s": step})}, keep=2)
    assert [s for s, _ in step_dirs(tmp_path)] == [6, 8]
    assert latest_checkpoint(tmp_path).name == "step_000008"
    with pytest.raises(RuntimeError, match="disk on fire"):
        save_checkpoint(tmp_path, 10, weights={}, stateful={"b": Broken()}, keep=2)
    assert [s for s, _ in step_dirs(tmp_path)] == [6, 8]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step_000006", "step_000008"]
    # re-saving an existing step replaces it
    save_checkpoint(tmp_path, 8, weights={}, stateful={"b": Box({"s": "new"})}, keep=2)
    b = Box()
    load_checkpoint(latest_checkpoint(tmp_path), {"b": b})
    assert b.state == {"s": "new"}
    assert latest_checkpoint(tmp_path / "nowhere") is None


def test_optimizer_state_round_trips_exactly(tmp_path):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(3))
    opt = torch.optim.AdamW([w], lr=0.1, betas=(0.8, 0.9))
    for _ in range(3):
        (w**2).sum().backward()
        opt.step()
        opt.zero_grad()
    ck = save_checkpoint(tmp_path, 3, weights={}, stateful={"opt": opt})
    w2 = torch.nn.Parameter(w.detach().clone())
    opt2 = torch.optim.AdamW([w2], lr=0.5)
    load_checkpoint(ck, {"opt": opt2})
    assert opt2.param_groups[0]["betas"] == (0.8, 0.9) and opt2.param_groups[0]["lr"] == 0.1
    for p, o in ((w, opt), (w2, opt2)):
        (p**2).sum().backward()
        o.step()
    assert torch.equal(w, w2)


def test_manifest_lists_every_file_with_its_size_and_sha256(tmp_path):
    import hashlib

    from sparring.storage.folders import MANIFEST
    from sparring.train.checkpoint import verify_checkpoint

    ck = save_checkpoint(tmp_path, 2, weights={"model": {"w": torch.arange(6.0)}},
                         stateful={"box": Box(NESTED)})
    files = json.loads((ck / MANIFEST).read_text())["files"]
    on_disk = sorted(p.name for p in ck.iterdir() if p.name != MANIFEST)
    assert sorted(files) == on_disk == ["model.safetensors", "state.json", "state.safetensors"]
    for name, entry in files.items():
        data = (ck / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    verify_checkpoint(ck)


def test_a_bad_file_raises_before_any_object_is_touched(tmp_path):
    from sparring.storage.folders import CheckpointError

    ck = save_checkpoint(tmp_path, 1, weights={}, stateful={"a": Box({"x": 1}),
                                                            "b": Box({"t": torch.ones(3)})})
    data = bytearray((ck / "state.safetensors").read_bytes())
    data[-1] ^= 1
    (ck / "state.safetensors").write_bytes(bytes(data))
    a, b = Box("untouched"), Box("untouched")
    with pytest.raises(CheckpointError, match="state.safetensors does not match its sha256"):
        load_checkpoint(ck, {"a": a, "b": b})
    assert a.state == b.state == "untouched"
    (ck / "state.json").write_text("{")
    with pytest.raises(CheckpointError, match="state.json"):
        load_checkpoint(ck, {"a": a}, verify=False)  # even unverified: a clear error
    assert a.state == "untouched"


def test_a_snapshot_keeps_the_state_it_was_taken_with(tmp_path):
    from sparring.train.checkpoint import FrozenState

    live = Box({"ema": {"g0": 0.5}, "t": torch.zeros(2), "rng": (1, [2, 3])})
    snap = FrozenState(live)
    live.state["ema"]["g0"] = 9.0  # the live object goes on changing, in place
    live.state["t"].add_(1)
    live.state["rng"][1].append(4)
    ck = save_checkpoint(tmp_path, 1, weights={}, stateful={"box": snap})
    back = Box()
    load_checkpoint(ck, {"box": back})
    assert back.state["ema"] == {"g0": 0.5} and back.state["t"].tolist() == [0.0, 0.0]
    assert back.state["rng"] == (1, [2, 3])


# ---------------------------------------------------------------- trust no manifest


def _two_steps(tmp_path):
    """Checkpoints 1 and 2 of ``tmp_path`` (weights ``model``, one stateful box)."""
    for step in (1, 2):
        save_checkpoint(tmp_path, step, weights={"model": {"w": torch.full((4,), float(step))}},
                        stateful={"box": Box({"step": step})})
    return dict(step_dirs(tmp_path))


def test_a_checkpoint_with_its_manifest_deleted_is_damaged(tmp_path, caplog):
    """state.json says the checkpoint has a manifest (``format``), so a deleted manifest.json
    is damage: loading raises and its garbled weights are never used; a checkpoint without
    that marker (written before manifests) keeps the structure-only check, with a
    "written by an older sparring" warning."""
    ck = _two_steps(tmp_path)[2]
    (ck / MANIFEST).unlink()
    (ck / "model.safetensors").write_bytes((ck / "model.safetensors").read_bytes()[:-4]
                                           + b"\xff" * 4)  # garbled, still parses
    missing = f"{ck / MANIFEST} is missing"
    for load in (verify_checkpoint, lambda c: load_weights(c, "model"),
                 lambda c: load_checkpoint(c, {"box": Box()})):
        with pytest.raises(CheckpointError, match=missing):
            load(ck)
    assert latest_intact_checkpoint(tmp_path) == step_dirs(tmp_path)[0][1]  # step 1, warning
    assert missing in caplog.text
    doc = json.loads((ck / "state.json").read_text())
    del doc["format"]  # as a checkpoint written before manifests
    (ck / "state.json").write_text(json.dumps(doc))
    caplog.clear()
    verify_checkpoint(ck)
    assert "written by an older sparring" in caplog.text


def _manifest_of(ck):
    return json.loads((ck / MANIFEST).read_text())


MALFORMED = {
    "not a mapping": lambda m: [],
    "files not a mapping": lambda m: {"files": list(m["files"])},
    "string values": lambda m: {"files": {k: "ok" for k in m["files"]}},
    "no sha256": lambda m: {"files": {k: {"bytes": v["bytes"]} for k, v in m["files"].items()}},
    "bytes as text": lambda m: {"files": {k: {**v, "bytes": str(v["bytes"])}
                                          for k, v in m["files"].items()}},
    "no state.json": lambda m: {"files": {k: v for k, v in m["files"].items()
                                          if k != "state.json"}},
}


@pytest.mark.parametrize("garbage", [*MALFORMED, "trailing garbage", "not utf-8"])
def test_a_malformed_manifest_is_damage_and_the_previous_checkpoint_is_used(tmp_path, garbage,
                                                                          caplog):
    """A malformed manifest (string values, no sha256, trailing garbage, not UTF-8) makes its
    checkpoint damaged, with a warning, not a traceback."""
    cks = _two_steps(tmp_path)
    path = cks[2] / MANIFEST
    if garbage == "trailing garbage":
        path.write_text(path.read_text() + "\n}garbage")
    elif garbage == "not utf-8":
        path.write_bytes(b"\xff\xfe" + path.read_bytes())
    else:
        path.write_text(json.dumps(MALFORMED[garbage](_manifest_of(cks[2]))))
    loads = [verify_checkpoint, lambda c: load_checkpoint(c, {"box": Box()})]
    if garbage != "no state.json":  # (the weights alone still match it)
        loads.append(lambda c: load_weights(c, "model"))
    for load in loads:
        with pytest.raises(CheckpointError, match=f"{cks[2]}/(manifest|state)"):
            load(cks[2])
    assert latest_intact_checkpoint(tmp_path) == cks[1]
    assert "skipping checkpoint" in caplog.text and str(cks[2]) in caplog.text


def _point_outside(ck, how, outside):
    """Make ``ck``'s manifest (or files) name something outside ``ck``."""
    m = _manifest_of(ck)
    if how == "absolute path":
        m["files"]["/dev/zero"] = {"bytes": 0, "sha256": "0" * 64}
    elif how == "parent path":
        m["files"]["../step_000001/model.safetensors"] = m["files"].pop("model.safetensors")
    elif how == "symlink out":
        target = outside / "elsewhere.safetensors"
        target.write_bytes((ck / "model.safetensors").read_bytes())
        (ck / "model.safetensors").unlink()
        (ck / "model.safetensors").symlink_to(target)
    elif how == "symlink to /dev/zero":
        (ck / "model.safetensors").unlink()
        (ck / "model.safetensors").symlink_to("/dev/zero")
        m["files"]["model.safetensors"]["bytes"] = 0
    elif how == "fifo":
        (ck / "model.safetensors").unlink()
        os.mkfifo(ck / "model.safetensors")
        m["files"]["model.safetensors"]["bytes"] = 0
    elif how == "weights named outside":
        doc = json.loads((ck / "state.json").read_text())
        doc["weights"] = ["../step_000001/model"]
        (ck / "state.json").write_text(json.dumps(doc))
        m["files"]["state.json"] = {"bytes": (ck / "state.json").stat().st_size,
                                    "sha256": sha256_file(ck / "state.json")}
    (ck / MANIFEST).write_text(json.dumps(m))


OUTSIDE = ["absolute path", "parent path", "symlink out", "symlink to /dev/zero", "fifo",
           "weights named outside"]


@pytest.mark.parametrize("how", OUTSIDE)
def test_a_manifest_entry_outside_the_checkpoint_is_refused_unopened(tmp_path, how, caplog):
    """Only regular files inside the checkpoint folder are opened: an entry naming /dev/zero
    or a ``../`` path makes the checkpoint damaged (no hang, nothing read outside it), and
    the previous one is used."""
    runs = tmp_path / "runs"
    cks = _two_steps(runs)
    _point_outside(cks[2], how, tmp_path)
    with deadline():
        with pytest.raises(CheckpointError, match=str(cks[2])):
            verify_checkpoint(cks[2])
        assert latest_intact_checkpoint(runs) == cks[1]
        if how != "weights named outside":
            with pytest.raises(CheckpointError, match=str(cks[2])):
                load_weights(cks[2], "model")  # what eval, play and export read
    with pytest.raises(CheckpointError, match="not a file name inside"):
        load_weights(cks[1], "../step_000002/model")


def test_a_safetensors_storage_error_is_the_os_error_behind_it(tmp_path, monkeypatch):
    """A full disk inside safetensors is a `SafetensorError`, which no caller maps;
    `write_tensors` raises the `OSError` it stands for (ENOSPC for a full disk)."""
    import errno

    from safetensors import SafetensorError

    import sparring.storage.folders as ck

    def fail(message):
        def save_file(tensors, filename, metadata=None):
            raise SafetensorError(message)
        return save_file

    path = tmp_path / "w.safetensors"
    for message, code in [("Error while serializing: I/O error: No space left on device "
                           "(os error 28)", errno.ENOSPC),
                          ("IoError(Os { code: 30, kind: ReadOnlyFilesystem, message: "
                           '"Read-only file system" })', errno.EROFS),
                          ("I/O error: disk quota", errno.EIO),
                          ("Error while serializing: invalid tensor", None)]:  # no OS error
        monkeypatch.setattr(ck, "save_file", fail(message))
        with pytest.raises(OSError if code else SafetensorError) as e:
            ck.write_tensors(path, {"w": torch.ones(2)})
        if code:
            assert e.value.errno == code and e.value.filename == str(path)
        assert str(e.value.__context__ or e.value) == message
        assert not path.exists() and list(tmp_path.iterdir()) == []
