"""Old config keys (the `league` and `critic` sections, `<thing>_final_ratio`) are still
read, from YAML, overrides and a run folder's saved config, with a warning."""

import logging
import typing
from dataclasses import fields, is_dataclass

import pytest
import yaml

from sparring.config import (
    Config,
    ConfigError,
    PolicySpec,
    aliases,
    check_resume_overrides,
    from_dict,
    load_config,
    to_dict,
)
from sparring.config.aliases import ALIASES, POLICY_SECTIONS

ENV = {"envs": [{"name": "tictactoe", "opponents": ["self", "pool"]}]}


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch, caplog):
    monkeypatch.setattr(aliases, "_warned", set())  # each test sees its own warnings
    caplog.set_level(logging.WARNING, logger=aliases.__name__)


def _field_type(cls, dotted):
    """The type of the field at ``dotted`` under dataclass ``cls`` (KeyError if none)."""
    tp = cls
    for part in dotted.split("."):
        hints = typing.get_type_hints(tp)
        if not is_dataclass(tp) or part not in {f.name for f in fields(tp)}:
            raise KeyError(dotted)
        tp = hints[part]
    return tp


def old_style(data):
    """A new-style config mapping with every aliased key back under its old name."""
    data = yaml.safe_load(yaml.safe_dump(data))  # a deep copy
    for old, new in ALIASES.items():
        (s, k), (s_new, k_new) = old.split("."), new.split(".")
        data.setdefault(s, {})[k] = data[s_new].pop(k_new)
    for section in ("league", "critic"):
        assert data.pop(section) == {}, section
    return data


def test_every_alias_names_a_new_key_of_the_schema_and_no_current_one():
    for old, new in ALIASES.items():
        _field_type(Config, new)
        with pytest.raises(KeyError):
            _field_type(Config, old)
        assert old.count(".") == new.count(".") == 1, "aliases move section.key pairs"
        if old.split(".")[0] in POLICY_SECTIONS:  # a policy's own section has the new key
            assert new.split(".")[0] in {f.name for f in fields(PolicySpec)}
    assert set(POLICY_SECTIONS) <= {f.name for f in fields(PolicySpec)}


def test_old_yaml_keys_read_as_the_new_ones_with_a_warning(tmp_path, caplog):
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({
        **ENV, "rollout": {"pool_every": 3, "pool_explore_final_ratio": 0.25},
        "algorithm": {"value": "on", "critic": "separate", "value_hidden": 8,
                      "archer": {"tau": 0.5}},
        "optim": {"min_lr_ratio": 0.1}}))
    cfg = load_config(path)
    assert (cfg.league.every, cfg.league.explore_final_ratio) == (3, 0.25)
    assert (cfg.critic.enabled, cfg.critic.kind, cfg.critic.hidden) == ("on", "separate", 8)
    assert cfg.critic.archer.tau == 0.5 and cfg.optim.lr_final_ratio == 0.1
    lines = caplog.text.splitlines()
    for old, new in [("rollout.pool_every", "league.every"), ("algorithm.value", "critic.enabled"),
                     ("algorithm.archer", "critic.archer"),
                     ("optim.min_lr_ratio", "optim.lr_final_ratio")]:
        assert any(old in line and new in line for line in lines), (old, new)


def test_old_overrides_set_the_new_keys_with_a_warning(caplog):
    cfg = from_dict(ENV, ["rollout.pool_every=4", "rollout.pool_bots=[random, tactical]",
                          "algorithm.archer.gamma=0.5", "algorithm.value=off"])
    assert cfg.league.every == 4 and cfg.league.bots == ["random", "tactical"]
    assert cfg.critic.archer.gamma == 0.5 and cfg.critic.enabled == "off"
    assert "algorithm.archer.gamma is the old name of critic.archer.gamma" in caplog.text
    assert "rollout.pool_every is the old name of league.every" in caplog.text


def test_an_override_overrides_a_file_whichever_name_either_uses():
    assert from_dict({**ENV, "rollout": {"pool_every": 2}}, ["league.every=7"]).league.every == 7
    assert from_dict({**ENV, "league": {"every": 2}}, ["rollout.pool_every=7"]).league.every == 7


@pytest.mark.parametrize("data, overrides, old, new", [
    ({"rollout": {"pool_every": 2}, "league": {"every": 3}}, [],
     "rollout.pool_every", "league.every"),
    ({"algorithm": {"archer": {"tau": 0.5}}, "critic": {"archer": {}}}, [],
     "algorithm.archer", "critic.archer"),
    ({"optim": {"min_lr_ratio": 0.1, "lr_final_ratio": 0.2}}, [],
     "optim.min_lr_ratio", "optim.lr_final_ratio"),
    ({}, ["rollout.pool_every=2", "league.every=3"], "rollout.pool_every", "league.every"),
    ({}, ["algorithm.archer.tau=0.5", "critic.archer={tau: 0.2}"],
     "algorithm.archer.tau", "critic.archer"),
    ({"policies": {"a": {"algorithm": {"value": "on"}, "critic": {"enabled": "off"}}}}, [],
     "policies.a.algorithm.value", "policies.a.critic.enabled"),
])
def test_an_old_key_and_its_new_one_together_are_an_error_naming_both(data, overrides, old, new):
    with pytest.raises(ConfigError, match=rf"^{old} and {new} are one setting"):
        from_dict({**ENV, **data}, overrides, check=False)


def test_a_policys_own_old_keys_move_to_its_own_new_sections(caplog):
    data = {"policies": {"a": {"algorithm": {"value": "on", "value_coef": 0.25}}, "b": None}}
    cfg = from_dict(data, ["policies.b.optim.min_lr_ratio=0.5"], check=False)
    assert cfg.policies["a"].critic == {"enabled": "on", "coef": 0.25}
    assert cfg.policies["a"].algorithm == {}
    assert cfg.policies["b"].optim == {"lr_final_ratio": 0.5}
    assert "policies.a.algorithm.value is the old name of policies.a.critic.enabled" \
        in caplog.text
    assert data == {"policies": {"a": {"algorithm": {"value": "on", "value_coef": 0.25}},
                                 "b": None}}, "the caller's mapping is left as it was"


def test_an_old_style_saved_config_loads_and_resumes_as_its_translation(tmp_path):
    from sparring.config.run_folder import read_run_config

    new = to_dict(from_dict(ENV, ["league.every=2", "critic.enabled=on", "critic.hidden=16",
                                  "optim.lr_final_ratio=0.1", "league.bots=[random]"]))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old_style(new), sort_keys=False))
    saved = read_run_config(tmp_path / "config.yaml")
    assert to_dict(saved) == new
    check_resume_overrides(saved, from_dict(new))  # no key changed
    check_resume_overrides(saved, read_run_config(tmp_path / "config.yaml", ["league.every=3"]))
    with pytest.raises(ConfigError, match="^critic.hidden: cannot change on --resume"):
        check_resume_overrides(saved, from_dict(new, ["algorithm.value_hidden=8"]))


def test_a_run_folder_with_an_old_style_config_resumes_and_evaluates(tmp_path, monkeypatch):
    """The product path: `sparring train --resume` and `sparring eval` of a run whose
    config.yaml an older Sparring wrote (rollout.pool_*, algorithm.value, ...)."""
    from sparring.cli import main
    from sparring.storage.metrics_file import read_metrics

    run = tmp_path / "run"
    small = ["model.options={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 2, "
             "intermediate_size: 64}", "rollout.episodes_per_step=8", "envs.0.group_size=4",
             "envs.0.opponents=[pool]", "league.every=1", "train.epochs=1", "eval.games=2",
             "eval.at_start=false", "logging.progress=false", "checkpoint.every=1"]
    assert main(["train", *small, "train.steps=2", f"train.run_dir={run}"]) == 0

    def make_old():
        written = yaml.safe_load((run / "config.yaml").read_text())
        (run / "config.yaml").write_text(yaml.safe_dump(old_style(written), sort_keys=False))

    make_old()
    assert main(["train", "--resume", str(run), "train.steps=3", "rollout.pool_max=4"]) == 0
    assert [r["step"] for r in read_metrics(run)][-1] == 3
    resumed = yaml.safe_load((run / "config.yaml").read_text())  # rewritten, new keys
    assert resumed["league"]["max"] == 4 and "pool_max" not in resumed["rollout"]
    make_old()
    assert main(["eval", str(run), "--vs", "random", "--games", "2"]) == 0
