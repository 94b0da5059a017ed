"""`sparring report` and the `train` command's config handling."""

import json

import yaml

from sparring.cli import main
from tests import train_helpers as th

PNG = b"\x89PNG\r\n\x1a\n"


def _write_run(run):
    rows = [{"step": 0, "eval/win": 0.5, "eval/win_lo": 0.4, "eval/win_hi": 0.6}]
    for s in range(1, 13):
        rows.append({"step": s, "reward": s / 10, "loss": 1.0 / s, "kl": 0.01 * s,
                     "time/rollout": 0.5, "throughput/episodes_per_s": 100.0 + s})
    rows[-1].update({"eval/win": 0.9, "eval/win_lo": 0.85, "eval/win_hi": 0.93})
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.yaml").write_text(yaml.safe_dump(
        {"algorithm": {"estimator": "turn_rtg", "objective": "ppo_clip", "kl": {"coef": 0.1}},
         "envs": [{"name": "tictactoe"}], "train": {"steps": 12}}))


def test_report_writes_plots_and_summary(tmp_path, capsys):
    run = tmp_path / "run1"
    _write_run(run)
    assert main(["report", str(run)]) == 0
    out = run / "report"
    assert capsys.readouterr().out.strip() == str(out / "summary.md")
    for name in ("training.png", "eval.png", "timing.png"):
        assert (out / name).read_bytes()[:8] == PNG
    md = (out / "summary.md").read_text()
    assert "| reward | 0.1 | 1.2 | 0.1 | 1.2 |" in md  # first, last, min, max
    assert "| loss | 1 | 0.08333 | 0.08333 | 1 |" in md
    assert "| eval/win | 0.5 [0.4, 0.6] (step 0) | 0.9 [0.85, 0.93] (step 12) |" in md
    assert "`turn_rtg`" in md and "tictactoe" in md and "![training](training.png)" in md


def test_report_of_an_empty_run_is_an_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_train_command_config_errors_and_printing(tmp_path, capsys, monkeypatch):
    th.register()
    try:
        ok = ["algorithm.estimator=test_centered", "algorithm.objective=test_clip"]
        assert main(["train", "--print-config", *ok, "train.steps=3"]) == 0
        printed = yaml.safe_load(capsys.readouterr().out)
        assert printed["train"]["steps"] == 3
        assert main(["train", *ok, "train.stepz=3"]) == 2
        assert "did you mean 'steps'" in capsys.readouterr().err
        assert main(["train", "no_such_recipe"]) == 2
        assert "no config 'no_such_recipe'" in capsys.readouterr().err
        cfg = tmp_path / "r.yaml"
        cfg.write_text(yaml.safe_dump({"algorithm": {"estimator": "test_centered",
                                                     "objective": "test_clip"}}))
        assert main(["train", str(cfg), "optim.lr=0.5", "--print-config"]) == 0
        assert yaml.safe_load(capsys.readouterr().out)["optim"]["lr"] == 0.5
        assert main(["train", "--print-defaults"]) == 0
        assert "# peak learning rate" in capsys.readouterr().out
        assert main(["list", "aggregations"]) == 0
    finally:
        th.unregister()


def test_metrics_logger_progress_truncate_and_missing_sinks(tmp_path, monkeypatch):
    import sys

    import pytest

    from sparring.storage.metrics_file import read_metrics, truncate_metrics
    from sparring.train.metrics import MetricsLogger

    lg = MetricsLogger(tmp_path, total_steps=3, progress=True, keys=["loss"])
    for s in (1, 2, 3):
        lg.log(s, {"loss": 1.0 / s, "nan": float("nan")})
    lg.close()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[1]["loss"] == 0.5
    truncate_metrics(tmp_path / "metrics.jsonl", 2)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    for missing in ("wandb", "torch.utils.tensorboard"):  # None: importing it fails
        monkeypatch.setitem(sys.modules, missing, None)
    with pytest.raises(ImportError, match=r"pip install 'sparring\[tensorboard\]'"):
        MetricsLogger(tmp_path / "a", total_steps=1, progress=False, tensorboard=True)
    with pytest.raises(ImportError, match=r"pip install 'sparring\[wandb\]'"):
        MetricsLogger(tmp_path / "b", total_steps=1, progress=False, wandb=True)
