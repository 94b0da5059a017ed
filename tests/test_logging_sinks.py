"""The metrics sinks for real: TensorBoard event files read back by TensorBoard's own reader,
and W&B in offline mode (no network) writing its run folder, read back record by record."""

import glob
import json
import struct
import sys
from pathlib import Path

import pytest

from sparring.train.metrics import MetricsLogger, bar_items

ROWS = [{"reward": 0.25, "loss": -1.5, "eval/x/win": 0.5, "flag": True, "note": "text"},
        {"reward": 0.75, "loss": -0.5}]
SCALARS = ("reward", "loss", "eval/x/win")  # booleans and strings are not sent to the sinks


def _log(run, **sinks):
    logger = MetricsLogger(run, total_steps=2, progress=False, **sinks)
    try:
        for step, row in enumerate(ROWS, 1):
            logger.log(step, row)
    finally:
        logger.close()


def _scalars_tb(folder):
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_events_read_back(tmp_path):
    pytest.importorskip("tensorboard", reason="needs the 'tensorboard' extra: "
                        "pip install 'sparring[tensorboard]'")
    _log(tmp_path, tensorboard=True)
    got = _scalars_tb(tmp_path / "tensorboard")
    assert got == {"reward": [(1, 0.25), (2, 0.75)], "loss": [(1, -1.5), (2, -0.5)],
                   "eval/x/win": [(1, 0.5)]}  # values exact in float32


def test_tensorboard_from_a_training_run(tmp_path):
    pytest.importorskip("tensorboard", reason="needs the 'tensorboard' extra: "
                        "pip install 'sparring[tensorboard]'")
    from sparring import Trainer

    run = tmp_path / "run"
    rows = Trainer("kuhn_selfplay", overrides=[
        "train.steps=2", "rollout.episodes_per_step=16", "envs.0.group_size=4",
        "eval.opponents=[]", "eval.at_start=false", "logging.progress=false",
        "logging.tensorboard=true", "checkpoint.every=0", f"train.run_dir={run}"]).fit()
    got = _scalars_tb(run / "tensorboard")
    for key in ("reward", "loss", "return/seat0", "time/rollout"):
        assert [s for s, _ in got[key]] == [r["step"] for r in rows] == [1, 2]
        assert [v for _, v in got[key]] == pytest.approx([r[key] for r in rows], rel=1e-6), key


def _wandb_records(path):
    """The records of a ``.wandb`` file: a 7-byte header, then LevelDB-log blocks of 32 KiB
    (each chunk: crc32 u32, length u16, type u8: 1 full, 2 first, 3 middle, 4 last), each
    record a ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2 as pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, out, parts = 7, [], b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):
            out.append(parts + chunk if kind == 4 else chunk)
            parts = b""
        elif kind in (2, 3):
            parts += chunk
    records = []
    for raw in out:
        rec = pb2.Record()
        rec.ParseFromString(raw)
        records.append(rec)
    return records


def test_wandb_offline_writes_its_run_folder(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="needs the 'wandb' extra: "
                                "pip install 'sparring[wandb]'")
    for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true",
                       "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true",
                       "WANDB_CONFIG_DIR": str(tmp_path / "cfg"),
                       "WANDB_CACHE_DIR": str(tmp_path / "cache"),
                       "WANDB_DATA_DIR": str(tmp_path / "data")}.items():
        monkeypatch.setenv(key, value)
    run = tmp_path / "run"
    try:
        _log(run, wandb=True, wandb_project="sparring-test")
    finally:
        wandb.teardown()
    files = glob.glob(str(run / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1
    history, project = [], None
    for rec in _wandb_records(files[0]):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            project = rec.run.project
        elif kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                     for i in rec.history.item}
            history.append({k: v for k, v in items.items() if k == "_step" or k[0] != "_"})
    assert project == "sparring-test"
    assert [h.pop("_step") for h in history] == [1, 2]
    assert history == [{k: v for k, v in row.items() if k in SCALARS} for row in ROWS]


def test_missing_sink_packages_name_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"pip install 'sparring\[wandb\]'"):
        MetricsLogger(tmp_path, total_steps=1, progress=False, wandb=True)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ImportError, match=r"pip install 'sparring\[tensorboard\]'"):
        MetricsLogger(tmp_path, total_steps=1, progress=False, tensorboard=True)


def test_the_progress_bar_shows_a_per_policy_metric_once_per_policy():
    row = {"reward": 0.5, "policy/speaker/loss": 0.1, "policy/listener/loss": 0.2,
           "policy/speaker/kl": 0.0, "eval/policy/speaker/x/loss": 9.0}
    assert bar_items(["reward", "loss", "kl", "entropy"], row) == [
        ("reward", 0.5), ("speaker.loss", 0.1), ("listener.loss", 0.2), ("speaker.kl", 0.0)]
    assert bar_items(["loss"], {"loss": 1.0, "policy/a/loss": 2.0}) == [("loss", 1.0)]
