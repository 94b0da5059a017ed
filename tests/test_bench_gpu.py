"""bench/gpu.py runs whole on a CPU: the smoke test for its runs on a GPU."""

import json

import pytest

from tests.helpers import load_bench


def test_the_gpu_script_runs_on_a_cpu_and_writes_its_tables(tmp_path):
    gpu = load_bench("gpu")
    result = gpu.main(["--device", "cpu", "--quick", "--out", str(tmp_path),
                       "--cpu-steps-per-s", "default=2.0"])
    assert json.loads((tmp_path / "gpu.json").read_text()) == json.loads(json.dumps(result))
    assert "| default | 3 |" in (tmp_path / "gpu.md").read_text()
    (row,) = result["throughput"]
    s = gpu.QUICK_SHAPE  # by hand: attention, MLP and two norms per layer, final norm, tied head
    kv = s["hidden_size"] // s["num_attention_heads"] * s["num_key_value_heads"]
    layer = 2 * s["hidden_size"] ** 2 + 2 * s["hidden_size"] * kv \
        + 3 * s["hidden_size"] * s["intermediate_size"] + 2 * s["hidden_size"]
    want = s["num_hidden_layers"] * layer + s["hidden_size"] + s["vocab_size"] * s["hidden_size"]
    assert row["params_non_embedding"] == want
    assert row["sampling_tokens_per_s"] > 0 and row["learner_tokens_per_s"] > 0
    assert row["learner_mfu"] is None  # no peak known for a CPU
    default, kuhn = result["recipes"]
    assert default["steps"] == kuhn["steps"] == 3 and default["steps_per_s"] > 0
    assert default["speedup_vs_cpu"] == pytest.approx(default["steps_per_s"] / 2.0)
    assert "speedup_vs_cpu" not in kuhn


def test_a_bad_cpu_figure_is_named(tmp_path):
    with pytest.raises(SystemExit, match="--cpu-steps-per-s: 'leduc=1'"):
        load_bench("gpu").main(["--device", "cpu", "--quick", "--out", str(tmp_path),
                      "--cpu-steps-per-s", "leduc=1"])


def test_the_device_tests_part_counts_from_pytests_report(tmp_path, monkeypatch):
    """The device-test part on the CPU, narrowed to the catalogue file: every test there
    skips on the CPU, one per estimator, shaper and objective."""
    from sparring.advantages import list_estimators
    from sparring.advantages.shaping import SHAPERS
    from sparring.objectives import list_objectives

    gpu = load_bench("gpu")
    monkeypatch.setattr(gpu, "DEVICE_TESTS", ("tests/test_on_device.py",))
    got = gpu.device_tests("cpu", tmp_path)
    want = len(list_estimators()) + len(list(SHAPERS)) + len(list_objectives())
    assert (got["passed"], got["failed"], got["skipped"]) == (0, 0, want)
    assert got["returncode"] == 0 and got["failing"] == []
    assert "- failed:" not in gpu.markdown("cpu", [], [], got)  # counts only, no failure list


def test_an_unknown_part_is_named(tmp_path):
    with pytest.raises(SystemExit, match="--parts: unknown gpus"):
        load_bench("gpu").main(["--device", "cpu", "--quick", "--out", str(tmp_path), "--parts", "gpus"])
