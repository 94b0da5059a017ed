"""bench/strategy_shift.py: total variation and crossings by hand, and the command on a
two-checkpoint Kuhn run (its strategies are the exact evaluation's)."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import load_bench

ROOT = Path(__file__).parents[1]
shift = load_bench("strategy_shift")


def test_total_variation_and_crossings_by_hand():
    a = {"K|J|r": {"fold": 0.1, "call": 0.9}, "K|J|c": {"call": 0.6, "raise": 0.4},
         "Q|J|r": {"fold": 0.95, "call": 0.05}, "J||r": {"fold": 0.3, "call": 0.7}}
    b = {"K|J|r": {"fold": 0.92, "call": 0.08}, "K|J|c": {"call": 0.5, "raise": 0.5},
         "Q|J|r": {"fold": 0.2, "call": 0.8}, "J||r": {"fold": 0.95, "call": 0.05}}
    # TV: (|0.1-0.92| + |0.9-0.08|) / 2 = 0.82; 0.1; 0.75; 0.65
    got = shift.shifts(a, b)
    assert [k for _, k in got] == ["K|J|r", "Q|J|r", "J||r", "K|J|c"]
    assert [tv for tv, _ in got] == pytest.approx([0.82, 0.75, 0.65, 0.1])
    assert shift.total_variation({"a": 1.0}, {"b": 1.0}) == 1.0  # moves of either side
    keys, up, down = shift.crossings(a, b, "fold", r"\|[JQK]\|")  # second round only
    assert (keys, up, down) == (["K|J|r", "Q|J|r"], ["K|J|r"], ["Q|J|r"])
    assert shift.crossings(a, b, "fold")[1] == ["K|J|r", "J||r"]


def test_the_command_on_two_checkpoints(tmp_path):
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "sparring", "train", "kuhn_selfplay", "train.steps=2",
                    "rollout.episodes_per_step=32", "eval.every=0", "eval.at_start=false",
                    "checkpoint.every=1", "logging.progress=false", f"train.run_dir={run}"],
                   cwd=ROOT, check=True, capture_output=True)
    ckpts = sorted(str(p) for p in (run / "checkpoints").glob("step_*"))
    a, ea = shift.strategy(ckpts[0])
    b, eb = shift.strategy(ckpts[-1])
    assert len(a) == len(b) == 12 and 0 < ea < 1 and 0 < eb < 1  # Kuhn: 12 states
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "strategy_shift.py"), ckpts[0],
                          ckpts[-1], "--top", "3", "--move", "bet"], cwd=ROOT, check=True,
                         capture_output=True, text=True, env={"PYTHONPATH": str(ROOT / "src"),
                                                              "PATH": ""}).stdout
    assert out.startswith(f"exploitability {ea:.4f} -> {eb:.4f}; 12 information states")
    assert len(out.splitlines()) == 5
