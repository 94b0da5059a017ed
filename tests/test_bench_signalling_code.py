"""bench/signalling_code.py on a one-step two-policy run: a distribution over the legal
answers for every colour and every symbol, as the run's rollouts prompt them."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import load_bench

ROOT = Path(__file__).parents[1]
signalling_code = load_bench("signalling_code")


def test_every_input_gets_a_distribution_over_its_legal_answers(tmp_path):
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "sparring", "train", "signalling_two_policies",
                    "train.steps=1", "rollout.episodes_per_step=16", "eval.every=0",
                    "eval.at_start=false", "checkpoint.every=1", "logging.progress=false",
                    f"train.run_dir={run}"], cwd=ROOT, check=True, capture_output=True)
    sent, read = signalling_code.code_tables(str(run))
    colours, symbols = ["red", "green", "blue", "yellow"], ["zib", "mog", "tup", "vex"]
    assert list(sent) == colours and list(read) == symbols
    for p in sent.values():
        assert list(p) == symbols and sum(p.values()) == pytest.approx(1.0, abs=1e-5)
    for p in read.values():
        assert list(p) == colours and sum(p.values()) == pytest.approx(1.0, abs=1e-5)
