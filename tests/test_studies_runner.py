"""The pure parts of studies/runner.py: the t interval, reading metrics.jsonl, reuse of
complete runs, the summary table and the plot (no training)."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "studies" / "runner.py"
_spec = importlib.util.spec_from_file_location("studies_runner", _PATH)
runner = importlib.util.module_from_spec(_spec)
sys.modules["studies_runner"] = runner
_spec.loader.exec_module(runner)


def write_run(d: Path, n_steps: int, *, reward=lambda s: 0.1 * s, eval_every: int = 2,
              episodes: float = 64.0) -> Path:
    """A metrics.jsonl as `sparring train` writes it: an eval row at step 0, then one row
    per step with training keys, eval keys every ``eval_every`` steps."""
    d.mkdir(parents=True, exist_ok=True)
    rows = [{"step": 0, "eval/g/exploitability": 1.0}]
    for s in range(1, n_steps + 1):
        r = {"step": s, "reward": reward(s), "episodes": episodes, "time/rollout": 0.5,
             "time/update": 1.5}
        if s % eval_every == 0 or s == n_steps:
            r.update({"eval/g/exploitability": 1.0 / (s + 1), "time/eval": 9.0})
        rows.append(r)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_t_interval_by_hand():
    mean, h = runner.t_interval([1.0, 2.0, 3.0])  # s = 1, n = 3, t_{0.975, 2} = 4.303
    assert mean == 2.0
    assert h == pytest.approx(4.303 / math.sqrt(3), rel=1e-4)
    mean, h = runner.t_interval([0.2, 0.4])  # s = 0.1414, t_{0.975, 1} = 12.706
    assert mean == pytest.approx(0.3)
    assert h == pytest.approx(12.706 * (0.2 / math.sqrt(2)) / math.sqrt(2), rel=1e-4)
    assert runner.t_interval([5.0])[0] == 5.0 and math.isnan(runner.t_interval([5.0])[1])
    assert all(math.isnan(v) for v in runner.t_interval([]))
    assert runner.t_interval([3.0, 3.0, 3.0]) == (3.0, 0.0)


def test_t_table_matches_scipy_and_is_conservative_between_rows():
    assert runner.t975_table(2) == 4.303
    assert runner.t975_table(35) == runner.T975[30]  # next smaller df: a wider interval
    assert runner.t975_table(500) == 1.96
    with pytest.raises(ValueError):
        runner.t975_table(0)
    stats = pytest.importorskip("scipy.stats")
    for df in runner.T975:
        assert runner.t975_table(df) == pytest.approx(stats.t.ppf(0.975, df), abs=6e-4)


def test_reading_metrics(tmp_path):
    d = write_run(tmp_path / "run", 5)
    assert runner.final_step(d) == 5
    assert runner.last(d, "reward") == pytest.approx(0.5)
    assert runner.last(d, "eval/g/exploitability") == pytest.approx(1 / 6)
    assert runner.last(d, "missing") is None
    assert runner.curve(d, "eval/g/exploitability") == ([0.0, 2.0, 4.0, 5.0],
                                                       [1.0, 1 / 3, 1 / 5, 1 / 6])
    xs, _ = runner.curve(d, "eval/g/exploitability", "episodes")
    assert xs == [0.0, 128.0, 256.0, 320.0]
    xs, ys = runner.curve(d, "reward", "time")  # rollout + update only, not eval
    assert xs == [2.0, 4.0, 6.0, 8.0, 10.0] and ys[0] == pytest.approx(0.1)
    # no record: the wall time is the sum of the time/* keys
    assert runner.wall_time(d) == pytest.approx(5 * 2.0 + 3 * 9.0)
    assert runner.tail_mean("reward", 2)[1](d) == pytest.approx(0.45)
    assert runner.final_step(tmp_path / "none") is None


def test_torn_last_line_is_dropped(tmp_path):
    d = write_run(tmp_path / "run", 3)
    with open(d / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "rew')
    assert runner.final_step(d) == 3


def test_complete_runs_are_reused_and_others_rerun(tmp_path):
    runs = runner.plan({"a": runner.Arm("kuhn_selfplay", ["x.y=1"]),
                        "b": runner.Arm("default", steps=7)}, [0, 1], tmp_path, 4)
    assert [(r.arm, r.seed, r.steps) for r in runs] == [("a", 0, 4), ("a", 1, 4),
                                                        ("b", 0, 7), ("b", 1, 7)]
    assert runs[0].args == ["kuhn_selfplay", "x.y=1", "train.steps=4", "train.seed=0",
                            "logging.progress=false"]
    assert runs[0].dir == tmp_path / "a" / "seed0" and runs[0].log == tmp_path / "a" / "seed0.log"
    for r, steps in zip(runs, (4, 3, 7, 7)):  # run 1 stopped early
        write_run(r.dir, steps)
        (r.dir / runner.RECORD).write_text(json.dumps({"args": r.args, "wall_s": 1.0}))
    (runs[2].dir / runner.RECORD).write_text(json.dumps({"args": ["other"], "wall_s": 1.0}))
    (runs[3].dir / runner.RECORD).unlink()  # no record: it matches no arguments
    assert [r.complete() for r in runs] == [True, False, False, False]
    assert runner.is_complete(runs[2].dir, 7)  # without args: the steps alone
    assert runner.plan({"a": runner.Arm("r")}, [0], tmp_path, 4, steps_override=2)[0].steps == 2


def test_run_jobs_skips_done_and_records(tmp_path):
    run = runner.plan({"a": runner.Arm("r")}, [0], tmp_path, 2)[0]
    write_run(run.dir, 1)  # incomplete, with its record: the job clears it and runs again
    (run.dir / runner.RECORD).write_text(json.dumps({"args": run.args}))
    job = run.job()
    job.cmd = [sys.executable, "-c", "print('hi')"]  # stands in for the training
    assert runner.run_jobs([job]) == []
    rec = runner.record(run.dir)
    assert rec["returncode"] == 0 and rec["args"] == run.args and rec["wall_s"] >= 0
    assert not (run.dir / "metrics.jsonl").exists() and "hi" in run.log.read_text()
    write_run(run.dir, 2)
    done = run.job()
    done.cmd = [sys.executable, "-c", "raise SystemExit(3)"]
    assert runner.run_jobs([done]) == []  # complete: not run
    fail = runner.Job("f", [sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "f.log",
                      lambda: False)
    assert runner.run_jobs([fail]) == ["f"]


def test_summary_and_plot(tmp_path):
    runs = runner.plan({"a": runner.Arm("r"), "b": runner.Arm("r")}, [0, 1, 2], tmp_path, 4)
    for r in runs:
        write_run(r.dir, 4, reward=lambda s, r=r: s * (1 + r.seed) * (2 if r.arm == "b" else 1))
    text = runner.summary(runs, ["reward", "missing", ("twice", lambda d: 2.0)])
    assert "### reward" in text and "### missing" not in text and "### twice" in text
    # arm a, final rewards 4, 8, 12: mean 8, s = 4, h = 4.303 * 4 / sqrt(3)
    h = runner.t_interval([4.0, 8.0, 12.0])[1]
    assert f"| a | 3 | 8 | ±{h:.4g} [{8 - h:.4g}, {8 + h:.4g}] | 0: 4, 1: 8, 2: 12 |" in text
    assert "### wall seconds per run" in text
    for x in ("step", "episodes", "time"):
        p = runner.plot(runs, "reward", tmp_path / "plots" / runner.plot_name("reward", x), x)
        assert p.exists() and p.read_bytes()[:4] == b"\x89PNG"
    assert runner.plot(runs, "missing", tmp_path / "m.png") is None
    assert runner.plot_name("eval/a b/x", "time") == "eval_a_b_x__time.png"


def test_mean_curve_interpolates_when_x_differ():
    xs, ys = runner._mean_curve([([0.0, 1.0, 2.0], [0.0, 1.0, 2.0]),
                                 ([0.0, 2.0, 4.0], [0.0, 2.0, 4.0])])
    assert xs[0] == 0.0 and xs[-1] == 2.0 and len(xs) == 100
    assert ys[-1] == pytest.approx(2.0)
    assert runner._mean_curve([([1.0], [3.0]), ([1.0], [5.0])]) == ([1.0], [4.0])
