"""Checkpoints: lossless state encoding, RNG round trip, atomic writes, keep-last-K."""

import json
import math
import random

import numpy as np
import pytest
import torch

from sparring.train.checkpoint import (
    RNGState,
    latest_checkpoint,
    load_checkpoint,
    load_weights,
    save_checkpoint,
    step_dirs,
)


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

    from sparring.train.checkpoint import MANIFEST, verify_checkpoint

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
    from sparring.train.checkpoint import CheckpointError

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
    from sparring.train.checkpoint import Snapshot

    live = Box({"ema": {"g0": 0.5}, "t": torch.zeros(2), "rng": (1, [2, 3])})
    snap = Snapshot(live)
    live.state["ema"]["g0"] = 9.0  # the live object goes on changing, in place
    live.state["t"].add_(1)
    live.state["rng"][1].append(4)
    ck = save_checkpoint(tmp_path, 1, weights={}, stateful={"box": snap})
    back = Box()
    load_checkpoint(ck, {"box": back})
    assert back.state["ema"] == {"g0": 0.5} and back.state["t"].tolist() == [0.0, 0.0]
    assert back.state["rng"] == (1, [2, 3])
