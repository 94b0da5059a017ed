"""bench/update_settings.py: the other arm's settings are parsed by the config's own rules,
limited to what the learner reads at each update, and a short run times both arms."""

import pytest

from sparring.config import ConfigError, find_recipe, load_config
from tests.helpers import load_bench

update_settings = load_bench("update_settings")


def test_other_settings_are_parsed_and_limited_to_what_an_update_reads():
    cfg = load_config(find_recipe("default"), [])
    got = update_settings.parse_other(
        ["train.microbatch_tokens=512", "train.minibatch_order=rows"], cfg)
    assert got == {"microbatch_tokens": 512, "minibatch_order": "rows"}
    with pytest.raises(SystemExit, match="train.steps=3: one of"):
        update_settings.parse_other(["train.steps=3"], cfg)  # read before the run, not per update
    with pytest.raises(ConfigError):
        update_settings.parse_other(["train.minibatch_order=columns"], cfg)


def test_a_short_run_times_both_settings(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["update_settings.py", "default", "rollout.episodes_per_step=32",
                                     "--steps", "2", "--other", "train.minibatch_order=rows"])
    update_settings.main()
    out = capsys.readouterr().out
    assert "| own: train.minibatch_order=prompt |" in out
    assert "| other: train.minibatch_order=rows |" in out
    assert "update, own / other: " in out
