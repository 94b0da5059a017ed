"""Files read from a run folder or a user's path are regular files of bounded size and
nesting (`sparring.storage.bounded`): a link to /dev/zero, a fifo, a file past its limit
or JSON nested past its limit is one line naming the file and the limit, never a hang, an
out-of-memory kill or a RecursionError."""

import json
import logging
import os
import re
import shutil

import pytest

from sparring.cli import main
from sparring.envs.openings import read_openings
from sparring.storage.bounded import (
    MAX_CONFIG_BYTES,
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    MAX_METRICS_BYTES,
    MAX_OPENINGS_BYTES,
    FileLimitError,
    read_json_bounded,
    read_text_bounded,
)
from sparring.storage.folders import CheckpointError, step_dirs
from sparring.storage.metrics_file import read_metrics
from sparring.train.checkpoint import verify_checkpoint
from tests.helpers import cli, deadline, one_line

TINY = ["model.options={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 2, "
        "intermediate_size: 64}", "rollout.episodes_per_step=8", "envs.0.group_size=4",
        "train.epochs=1", "eval.games=2", "eval.at_start=false", "logging.progress=false"]
NOT_REGULAR = "not a regular file (a device, fifo or folder)"
NOT_REGULAR_RE = re.escape(NOT_REGULAR)
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished one-step tic-tac-toe run (tiny model)."""
    folder = tmp_path_factory.mktemp("bounded") / "run"
    assert main(["train", *TINY, "train.steps=1", f"train.run_dir={folder}"]) == 0
    return folder


@pytest.fixture
def copy(run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def sparse(path, size):
    """A file of ``size`` bytes that takes no disk (a hole)."""
    with open(path, "wb") as f:
        f.truncate(size)


def replace(path, kind):
    path.unlink()
    if kind == "zero":
        path.symlink_to("/dev/zero")
    else:
        os.mkfifo(path)


@pytest.mark.parametrize("kind", ["zero", "fifo"])
@pytest.mark.parametrize("command", ["eval", "export", "train --resume"])
def test_a_config_yaml_that_is_a_device_or_fifo_is_refused_unread(kind, command, copy,
                                                                  tmp_path, capsys):
    replace(copy / "config.yaml", kind)
    out = [str(tmp_path / "out")] if command == "export" else []
    with deadline(30):
        rc, _, err = cli(capsys, *command.split(), copy, *out)
    assert rc == 2
    assert f"{copy / 'config.yaml'}: {NOT_REGULAR}; a config file must be one" \
        in one_line(err)


@pytest.mark.parametrize("kind", ["zero", "fifo"])
def test_report_leaves_out_the_headline_of_a_config_yaml_that_is_a_device(kind, copy, capsys,
                                                                         caplog):
    replace(copy / "config.yaml", kind)
    with deadline(30):
        rc, out, _ = cli(capsys, "report", copy)
    assert rc == 0 and out.strip() == str(copy / "report" / "summary.md")
    assert f"{copy / 'config.yaml'}: {NOT_REGULAR}; a config file must be one; the report " \
           "leaves out its headline" in caplog.text


def test_a_config_past_its_limit_is_refused_naming_the_limit(copy, capsys):
    sparse(copy / "config.yaml", MAX_CONFIG_BYTES + 1)
    rc, _, err = cli(capsys, "eval", copy)
    assert rc == 2 and one_line(err) == (
        f"config error: {copy / 'config.yaml'}: {MAX_CONFIG_BYTES + 1:,} bytes, more than the "
        f"{MAX_CONFIG_BYTES:,} a config file may have")


@pytest.mark.parametrize("kind", ["zero", "fifo"])
@pytest.mark.parametrize("command", ["report", "train --resume"])
def test_a_metrics_file_that_is_a_device_or_fifo_is_refused_unread(kind, command, copy,
                                                                   capsys):
    replace(copy / "metrics.jsonl", kind)
    command += " train.steps=2" * command.startswith("train")
    with deadline(30):
        rc, _, err = cli(capsys, *command.split()[:2], copy, *command.split()[2:])
    assert rc == 2
    assert f"{copy / 'metrics.jsonl'}: {NOT_REGULAR}; a metrics file must be one" \
        in one_line(err)


def test_a_metrics_file_past_its_limits_is_refused_naming_the_limit(tmp_path):
    path = tmp_path / "metrics.jsonl"
    sparse(path, MAX_METRICS_BYTES + 1)
    with pytest.raises(FileLimitError, match=f"^{path}: {MAX_METRICS_BYTES + 1:,} bytes, "
                       f"more than the {MAX_METRICS_BYTES:,} a metrics file may have$"):
        read_metrics(path)
    path.write_text('{"step": 1}\n{"step": 2, "x": "' + "a" * (1 << 20) + '"}\n')
    with pytest.raises(FileLimitError, match=f"^{path}: line 2 is longer than the 1,048,576 "
                       "bytes a line of a metrics file may have$"):
        read_metrics(path)


def test_a_deeply_nested_metrics_row_is_an_error_naming_the_line(copy, capsys, caplog):
    path = copy / "metrics.jsonl"
    rows = path.read_text().splitlines()
    path.write_text("\n".join([DEEP, *rows]) + "\n")
    for command in (["report", copy], ["train", "--resume", copy, "train.steps=2"]):
        rc, _, err = cli(capsys, *command)
        assert rc == 2 and one_line(err).endswith(
            f"error: {path}: line 1 is not a metrics row (nested more than {MAX_JSON_DEPTH} "
            "levels deep); repair or delete that line")
    caplog.set_level(logging.WARNING)
    path.write_text(rows[0] + "\n" + "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    assert read_metrics(path) == [json.loads(rows[0])]  # a last line is dropped as torn
    assert f"{path}: dropping its torn last line 2 (nested more than {MAX_JSON_DEPTH} " \
           "levels deep)" in caplog.text


def test_checkpoint_json_past_its_limits_is_damage(copy):
    ckpt = step_dirs(copy)[-1][1]
    state = ckpt / "state.json"
    doc = json.loads(state.read_text())
    manifest = ckpt / "manifest.json"
    manifest.rename(ckpt.parent / "manifest.json")  # state.json is read first without one
    for bad, message in (
            (lambda: sparse(state, MAX_JSON_BYTES + 1),
             f"{state}: {MAX_JSON_BYTES + 1:,} bytes, more than the {MAX_JSON_BYTES:,} a "
             "state.json may have"),
            (lambda: state.write_text(json.dumps({**doc, "deep": json.loads(
                "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)})),
             f"{state}: nested more than {MAX_JSON_DEPTH} levels deep; not a state.json"),
            (lambda: state.write_text(DEEP),
             f"{state}: nested more than {MAX_JSON_DEPTH} levels deep; not a state.json")):
        bad()
        with pytest.raises(CheckpointError, match=f"^{message}$"):
            verify_checkpoint(ckpt)
    sparse(manifest, MAX_JSON_BYTES + 1)
    state.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=f"^{manifest}: {MAX_JSON_BYTES + 1:,} bytes, "
                       f"more than the {MAX_JSON_BYTES:,} a manifest may have$"):
        verify_checkpoint(ckpt)


def test_an_openings_file_past_its_limit_is_refused(tmp_path):
    path = tmp_path / "big.txt"
    sparse(path, MAX_OPENINGS_BYTES + 1)
    with pytest.raises(FileLimitError, match=f"{MAX_OPENINGS_BYTES:,} an openings file may "):
        read_openings(path)


def test_the_bounded_readers_refuse_what_is_no_regular_file(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with deadline(10):
        for path in ("/dev/zero", fifo, tmp_path):
            with pytest.raises(FileLimitError,
                               match=f"^{path}: {NOT_REGULAR_RE}; a thing must be one$"):
                read_text_bounded(path, 10, "thing")
    (tmp_path / "ok.json").write_text('{"a": [1, 2]}')
    assert read_json_bounded(tmp_path / "ok.json", 13) == {"a": [1, 2]}
    with pytest.raises(FileLimitError, match="13 bytes, more than the 12 a thing may have"):
        read_json_bounded(tmp_path / "ok.json", 12, "thing")
