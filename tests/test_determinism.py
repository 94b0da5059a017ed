"""``train.deterministic``: the switch turns torch's deterministic kernels on (warn-only)
in the process that builds a run's parts, sets cuBLAS's workspace unless the user did,
leaves torch alone when off, and a run under it computes what the plain run computes."""

import math
import os

import pytest
import torch

from sparring import Config, Trainer
from sparring.report.plots import TIMING
from sparring.train.determinism import CUBLAS_WORKSPACE, use_deterministic_kernels

FAST = ["train.steps=2", "rollout.episodes_per_step=16", "envs.0.group_size=4",
        "eval.games=4", "eval.opponents=[random]", "eval.exploitability=false",
        "logging.progress=false", "checkpoint.every=0"]


@pytest.fixture
def torch_flags():
    """Put torch's process-wide deterministic flags back after the test."""
    was = (torch.are_deterministic_algorithms_enabled(),
           torch.is_deterministic_algorithms_warn_only_enabled())
    yield
    torch.use_deterministic_algorithms(was[0], warn_only=was[1])


def test_the_switch_sets_torch_and_cublas_and_off_leaves_them(torch_flags, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.use_deterministic_algorithms(False)
    use_deterministic_kernels(False)
    assert not torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # the user's own setting stands when off
    use_deterministic_kernels(False)
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    use_deterministic_kernels(True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled()  # an op without one warns
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    use_deterministic_kernels(True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


@pytest.mark.parametrize("recipe", ["kuhn_selfplay", "signalling_two_policies"])
def test_a_deterministic_run_computes_what_the_plain_run_computes(recipe, tmp_path,
                                                                  torch_flags):
    """Equal to float tolerance (an ordered kernel may sum in another order; on one thread
    here they agree to the bit); an uninitialised buffer the code read would show (the
    switch fills new tensors with NaN). Kuhn: one policy, constrained decoding;
    signalling: two policies."""
    torch.use_deterministic_algorithms(False)
    rows = {}
    for det in (False, True):
        cfg = Config.load(recipe, [*FAST, f"train.deterministic={str(det).lower()}",
                                   f"train.run_dir={tmp_path / str(det)}"])
        rows[det] = Trainer(cfg).fit()
        assert torch.are_deterministic_algorithms_enabled() is det
    for plain, det in zip(rows[False], rows[True], strict=True):
        assert plain.keys() == det.keys()
        for key, value in plain.items():
            if key.startswith(TIMING):
                continue
            assert math.isclose(value, det[key], rel_tol=1e-5, abs_tol=1e-6), key
