"""The Python API: `Config.load` finds recipes as the CLI does, `Trainer.fit` trains and
returns the run's metrics, callbacks see each step and each evaluation, `StopTraining`."""

import json
from pathlib import Path

import pytest
import yaml

from sparring import Config, StopTraining, Trainer
from sparring.cli import main
from sparring.config import load_config, to_dict

REPO = Path(__file__).resolve().parents[1]
FAST = ["rollout.episodes_per_step=16", "envs.0.group_size=4", "eval.games=4",
        "eval.opponents=[random]", "eval.exploitability=false", "logging.progress=false",
        "checkpoint.every=0"]


def test_config_load_finds_recipes_like_the_cli(tmp_path, monkeypatch, capsys):
    by_name = Config.load("kuhn_selfplay", overrides=["train.steps=3"])
    by_path = load_config(REPO / "configs" / "kuhn_selfplay.yaml", ["train.steps=3"])
    assert to_dict(by_name) == to_dict(by_path) and by_name.train.steps == 3
    assert to_dict(Config.load()) == to_dict(load_config(REPO / "configs" / "default.yaml"))
    assert main(["train", "kuhn_selfplay", "train.steps=3", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == to_dict(by_name)
    monkeypatch.chdir(tmp_path)  # ./configs is searched first, then the checkout's
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "mine.yaml").write_text("train: {steps: 7}\n")
    assert Config.load("mine").train.steps == 7
    assert Config.load("kuhn_selfplay").train.name == "kuhn_selfplay"
    with pytest.raises(FileNotFoundError, match="no config 'nope'"):
        Config.load("nope")


def test_fit_returns_metrics_and_calls_back(tmp_path):
    run = tmp_path / "run"
    cfg = Config.load("kuhn_selfplay", [*FAST, "train.steps=2", "eval.every=2",
                                        f"train.run_dir={run}"])
    steps, evals = [], []

    class Recorder:
        def on_eval(self, step, metrics):
            evals.append((step, metrics))

    trainer = Trainer(cfg, on_step=lambda s, m: steps.append((s, m)), callbacks=[Recorder()])
    rows = trainer.fit()
    on_disk = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows == on_disk == trainer.metrics
    assert [r["step"] for r in rows] == [0, 1, 2]  # 0: the evaluation before training
    assert [s for s, _ in steps] == [1, 2] and [m for _, m in steps] == rows[1:]
    assert [s for s, _ in evals] == [0, 2]
    for (_, got), row in zip(evals, (rows[0], rows[2])):
        want = {k[len("eval/"):]: v for k, v in row.items() if k.startswith("eval/")}
        assert got == want and "kuhn_poker/random/win" in got
    assert trainer.run_dir == run and trainer.policy.model is trainer.model


def test_stop_training_from_a_callback_leaves_a_resumable_checkpoint(tmp_path):
    run = tmp_path / "run"

    def stop_after_one(step, metrics):
        if step == 1:
            raise StopTraining

    rows = Trainer("kuhn_selfplay", overrides=[*FAST, "train.steps=5", "eval.at_start=false",
                                               f"train.run_dir={run}"],
                   on_step=stop_after_one).fit()
    assert [r["step"] for r in rows] == [1]
    assert [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step")] \
        == ["step_000001"]


def test_trainer_errors(tmp_path):
    with pytest.raises(ValueError, match="overrides apply to a recipe name"):
        Trainer(Config.load("kuhn_selfplay"), overrides=["train.steps=1"])
    with pytest.raises(TypeError, match="neither on_step nor on_eval"):
        Trainer("kuhn_selfplay", callbacks=[object()])
    with pytest.raises(RuntimeError, match="call fit"):
        _ = Trainer("kuhn_selfplay").policy


def test_an_api_run_logs_what_the_cli_run_logs(tmp_path):
    """The same config from Python (`Trainer.fit`) and from the command line logs the same
    rows, `league/*` keys included: the loop reaches the rollouts' `league_metrics` (and
    the Ray workers' `correct`) through the API as it does through the CLI."""
    from sparring.storage.metrics_file import read_metrics

    league = ["envs.0.opponents=[self, pool]", "league.bots=[random]",
              "league.every=1", "train.steps=3", "eval.every=3"]
    cli_run, api_run = tmp_path / "cli", tmp_path / "api"
    assert main(["train", "kuhn_selfplay", *FAST, *league, f"train.run_dir={cli_run}"]) == 0
    Trainer("kuhn_selfplay", overrides=[*FAST, *league, f"train.run_dir={api_run}"]).fit()

    def rows(run):
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))}
                for r in read_metrics(run)]
    assert any(k.startswith("league/") for k in rows(cli_run)[-1])
    assert rows(api_run) == rows(cli_run)
