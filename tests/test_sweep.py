"""`sparring sweep`: seed ranges, metric specs, the statistics across seeds (against hand
computations) and one small sweep end to end."""

import json
import math

import pytest

from sparring.cli import main
from sparring.grid import Run
from sparring.sweep import (
    Metric,
    SweepError,
    bootstrap_interval,
    iqm,
    parse_metric,
    parse_seeds,
    seed_values,
    summarise,
    sweep,
    table,
)


@pytest.mark.parametrize("text, want", [
    ("0-7", list(range(8))), ("3", [3]), ("0,2,5", [0, 2, 5]), ("0-3,8", [0, 1, 2, 3, 8]),
    ("5,1-3,2", [5, 1, 2, 3]), (" 4 - 4 ".replace(" ", ""), [4])])
def test_seed_ranges(text, want):
    assert parse_seeds(text) == want


@pytest.mark.parametrize("text, says", [
    ("7-0", "the range '7-0' is empty"), ("a", "'a' is not a seed or a range"),
    ("1-", "'1-' is not a seed"), ("", "'' is not a seed"), ("-1", "'-1' is not a seed"),
    ("0-5000", "more than 1000"),
    (",".join(f"{k * 1000}-{k * 1000 + 999}" for k in range(50)),
     r"^--seeds: '0-999,1000-1999,.*' holds more than 1000 seeds$"),
    ("0-999,1000", r"^--seeds: '0-999,1000' holds more than 1000 seeds$"),
    ("4294967296", r"^--seeds: 4294967296 is out of range \(a seed is at most 4294967295, "
     r"as train.seed\)$")])
def test_bad_seed_ranges_are_named(text, says):
    with pytest.raises(SweepError, match=says):
        parse_seeds(text)


@pytest.mark.parametrize("jobs", [0, 65, 1000])
def test_sweep_jobs_are_bounded_before_anything_runs(jobs, tmp_path):
    with pytest.raises(SweepError, match=rf"^--jobs: {jobs}; must be in \[1, 64\]$"):
        sweep("default", [0], jobs=jobs, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_metric_specs():
    assert parse_metric("eval/kuhn_poker/exploitability") == \
        Metric("eval/kuhn_poker/exploitability", "min")
    assert parse_metric("eval/t/minimax_exact/non_loss") == Metric("eval/t/minimax_exact/non_loss")
    assert parse_metric("reward:min") == Metric("reward", "min")
    assert parse_metric("eval/x/non_loss>=0.95") == Metric("eval/x/non_loss", "max", 0.95)
    assert parse_metric("eval/x/exploitability<=0.05") == \
        Metric("eval/x/exploitability", "min", 0.05)
    with pytest.raises(SweepError, match="not a number"):
        parse_metric("k>=high")


def test_statistics_by_hand():
    x = {s: v for s, v in enumerate([16.0, 1.0, 128.0, 4.0, 32.0, 2.0, 64.0, 8.0])}
    # sorted 1 2 4 8 16 32 64 128: median (8 + 16) / 2 = 12; IQM drops 2 at each end,
    # mean(4, 8, 16, 32) = 15
    assert iqm(list(x.values())) == pytest.approx(15.0)
    up = summarise(Metric("k", "max", 10.0), "final", x)
    assert up.median == pytest.approx(12.0) and up.iqm == pytest.approx(15.0)
    assert up.worst == 1.0 and up.reached == 4  # 16, 32, 64, 128
    down = summarise(Metric("k", "min", 10.0), "final", x)
    assert down.worst == 128.0 and down.reached == 4  # 1, 2, 4, 8
    for lo, hi in (up.median_ci, up.iqm_ci):
        assert 1.0 <= lo <= hi <= 128.0
    assert up.median_ci[0] <= 12.0 <= up.median_ci[1]
    # the resampling is seeded: the same table twice
    assert summarise(Metric("k"), "final", x).iqm_ci == up.iqm_ci
    assert bootstrap_interval([0.5, 0.5, 0.5], iqm) == (0.5, 0.5)
    assert all(math.isnan(v) for v in bootstrap_interval([0.5], iqm))
    md = table([up])
    assert "| k >= 10 | final | 8 | 12.000 [" in md and "| 1.000 | 4/8 |" in md


def _run_with(tmp_path, seed, values, key="eval/g/exploitability"):
    d = tmp_path / f"seed{seed}"
    d.mkdir()
    lines = [{"step": 10 * i, key: v} for i, v in enumerate(values)]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return Run("a", seed, d, 10, [])


def test_final_and_best_follow_the_metric_direction(tmp_path):
    runs = [_run_with(tmp_path, 0, [0.8, 0.1, 0.3]), _run_with(tmp_path, 1, [0.7, 0.5, 0.6]),
            _run_with(tmp_path, 2, [])]
    final, best = seed_values(runs, Metric("eval/g/exploitability", "min"))
    assert final == {0: 0.3, 1: 0.6} and best == {0: 0.1, 1: 0.5}
    final, best = seed_values(runs, Metric("eval/g/exploitability", "max"))
    assert best == {0: 0.8, 1: 0.7}


def test_a_small_sweep_end_to_end(tmp_path, capsys):
    """Two seeds of a one-step tiny run: the table names both seeds, the plot is written,
    and a second call reuses the finished runs."""
    args = ["sweep", "default", "--seeds", "0-1", "--jobs", "2", "--threads", "1",
            "--out", str(tmp_path / "sw"), "--metric", "eval/tictactoe/random/non_loss>=0.5",
            "train.steps=1", "eval.games=4", "rollout.episodes_per_step=8",
            "envs.0.group_size=4", "eval.opponents=[random]"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| eval/tictactoe/random/non_loss >= 0.5 | final | 2 |" in out
    assert "0: " in out and "1: " in out
    assert (tmp_path / "sw" / "sweep.png").is_file()
    assert (tmp_path / "sw" / "sweep.md").read_text().startswith("# Sweep of default over 2")
    assert main(args) == 0
    assert "2 of 2 already done, reused" in capsys.readouterr().out
