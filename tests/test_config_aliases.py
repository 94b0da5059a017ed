"""Old config keys (`sparring.config.aliases`) are still read until the next release, from
YAML, overrides and a run folder's saved config, with a warning naming the new spelling;
the names kept alive from before 0.2.0 are gone."""

import logging
import warnings

import pytest
import yaml

from sparring.config import (
    ConfigError,
    aliases,
    check_resume_overrides,
    from_dict,
    load_config,
    to_dict,
)
from sparring.config.aliases import FOLDED, REMOVED

ENV = {"envs": [{"name": "tictactoe", "opponents": ["self", "pool"]}]}

# what each old key of an env looked like in a saved config (every key, at its default)
OLD_ENV_DEFAULTS = {"opening_moves": 0, "openings": "", "openings_share": 1.0,
                    "loss_replay": 0.0, "loss_replay_size": 256, "loss_replay_depth": 2,
                    "symmetric_views": False}


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch, caplog):
    monkeypatch.setattr(aliases, "_warned", set())  # each test sees its own warnings
    caplog.set_level(logging.WARNING, logger=aliases.__name__)


OLD_EXPLORE = {"explore": 0.0, "explore_schedule": "constant", "explore_final_ratio": 0.0,
               "explore_turns": 0, "explore_tactical": False}
EXPLORE_AS = {"explore": "rate", "explore_schedule": "schedule",
              "explore_final_ratio": "final_ratio", "explore_turns": "turns",
              "explore_tactical": "tactical"}


def old_style(data):
    """A saved config as the previous release wrote it: every old key, the new settings
    they became left out (only those whose old keys can say what the new ones do)."""
    data = yaml.safe_load(yaml.safe_dump(data))  # a deep copy
    explore = data.pop("exploration", {})
    for section, who, keys in (("rollout", "learner", list(OLD_EXPLORE)[:3]),
                               ("league", "league", list(OLD_EXPLORE))):
        spec = explore.pop(who, {})
        data.setdefault(section, {}).update({k: spec.get(EXPLORE_AS[k], OLD_EXPLORE[k])
                                             for k in keys})
    assert not explore, explore
    correction = data["algorithm"].pop("importance_correction")
    level, clip = correction["level"], correction["clip"]
    data["algorithm"].update(sampler_correction=level, sampler_correction_clip=clip)
    data.setdefault("distributed", {}).update(
        correction="token" if level == "auto" else level, correction_clip=clip)
    head = data["model"].pop("head")
    frozen = head["name"] == "frozen_features"
    data.setdefault("optim", {})["body_lr_scale"] = 0.0 if frozen else head.get(
        "body_lr_scale", 1.0)
    data.setdefault("train", {}).update(
        feature_cache=head.get("cache", 65536), feature_center=head.get("center", False),
        feature_whiten=head.get("whiten", 0.0))
    for env in data.get("envs", []):
        starts = {s["name"]: s for s in env.pop("starts")}
        assert set(starts) <= {"random_opening", "loss_replay", "openings",
                               "symmetric_views"}, starts
        env.update(OLD_ENV_DEFAULTS)
        if "random_opening" in starts:
            env["opening_moves"] = starts["random_opening"].get("moves", 4)
        if "openings" in starts:
            env["openings"] = starts["openings"]["file"]
            env["openings_share"] = starts["openings"].get("share", 1.0)
        if "loss_replay" in starts:
            lr = starts["loss_replay"]
            env["loss_replay"] = lr.get("share", 0.5)
            env["loss_replay_size"] = lr.get("size", 256)
            env["loss_replay_depth"] = lr.get("depth", 2)
        env["symmetric_views"] = "symmetric_views" in starts
    return data


def test_every_folded_key_names_a_setting_of_the_schema_and_no_current_one():
    plain = to_dict(from_dict(ENV))
    for f in FOLDED:
        scope = {"": plain, "envs": plain["envs"][0]}.get(f.scope)
        if scope is None:
            continue
        head = f.new.split(".")[0]
        assert head in scope, (f.scope, f.new)
        for old in f.old:
            assert old.split(".")[-1] not in scope or "." in old, (f.scope, old)
    assert set(REMOVED) == {"", "envs", "policies"}


def test_the_names_kept_from_before_0_2_0_are_gone():
    for key in ("rollout.pool_every=3", "algorithm.value=on", "algorithm.critic=separate",
                "optim.min_lr_ratio=0.1", "algorithm.archer={tau: 0.5}"):
        with pytest.raises(ConfigError, match=f"^unknown key '{key.split('=')[0]}'"):
            from_dict(ENV, [key], check=False)
    with pytest.raises(ConfigError, match="^unknown key 'rollout.pool_every'"):
        from_dict({**ENV, "rollout": {"pool_every": 3}}, check=False)


def test_old_start_keys_read_as_start_components_with_a_warning(tmp_path, caplog):
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"envs": [{
        "name": "tictactoe", "opponents": ["self"], "opening_moves": 3, "loss_replay": 0.25,
        "loss_replay_depth": 1, "openings_share": 0.5, "symmetric_views": False}]}))
    with pytest.warns(DeprecationWarning, match="envs.0.opening_moves is the old spelling"):
        cfg = load_config(path)
    assert cfg.envs[0].starts == [{"name": "random_opening", "moves": 3},
                                  {"name": "loss_replay", "share": 0.25, "depth": 1}]
    text = caplog.text
    assert ("envs.0.opening_moves is the old spelling of envs.0.starts: "
            "[{name: random_opening, moves: N}]") in text
    assert "envs.0.loss_replay_depth is the old spelling of envs.0.starts: " in text
    assert "until the next release" in text
    assert "envs.0.symmetric_views is the old spelling" in text  # read, though off


def test_old_exploration_keys_read_as_exploration_entries(tmp_path, caplog):
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({
        **ENV, "rollout": {"explore": 0.1, "explore_schedule": "cosine"},
        "league": {"explore": 0.5, "explore_turns": 2, "explore_tactical": False, "every": 3},
        "algorithm": {"recompute_old_logp": True}}))
    cfg = load_config(path)
    assert to_dict(cfg)["exploration"] == {
        "learner": {"rate": 0.1, "schedule": "cosine", "final_ratio": 0.0, "turns": 0,
                    "tactical": False},
        "league": {"rate": 0.5, "schedule": "constant", "final_ratio": 0.0, "turns": 2,
                   "tactical": False}}
    assert cfg.league.every == 3
    assert "rollout.explore is the old spelling of exploration.learner.rate" in caplog.text
    assert "league.explore_turns is the old spelling of exploration.league.turns" in caplog.text
    cfg = from_dict(ENV, ["league.explore=0.25", "exploration.league.turns=1"], check=False)
    assert (cfg.exploration["league"].rate, cfg.exploration["league"].turns) == (0.25, 1)
    quiet = {**ENV, "rollout": {"explore": 0.0}, "league": dict(OLD_EXPLORE)}
    assert from_dict(quiet, check=False).exploration == {}  # at their defaults: nobody explores
    with pytest.raises(ConfigError, match=r"^league.explore and exploration.league.rate are "
                                          r"one setting"):
        from_dict({**ENV, "league": {"explore": 0.5}, "exploration": {"league": {"rate": 0.1}}},
                  check=False)
    with pytest.raises(ConfigError, match=r"^rollout.explore and exploration.learner.rate are "
                                          r"one setting"):
        from_dict(ENV, ["rollout.explore=0.5", "exploration.learner.rate=0.1"], check=False)


def test_the_two_old_importance_corrections_read_as_one():
    def read(algorithm=None, distributed=None, overrides=(), policy=None):
        data = {**ENV, "algorithm": {"recompute_old_logp": True, **(algorithm or {})},
                "distributed": distributed or {}}
        if policy is not None:
            data["policies"] = {"a": {"algorithm": policy}}
        return from_dict(data, list(overrides), check=False)

    saved = read({"sampler_correction": "auto", "sampler_correction_clip": 2.0},
                 {"correction": "token", "correction_clip": 2.0})  # the defaults: say nothing
    assert to_dict(saved)["algorithm"]["importance_correction"] == {"level": "auto",
                                                                    "clip": 2.0}
    one = read({"sampler_correction": "turn"}, {"correction": "token", "correction_clip": 1.5})
    assert (one.algorithm.importance_correction.level,
            one.algorithm.importance_correction.clip) == ("turn", 1.5)
    assert read(distributed={"correction": "off"}).algorithm.importance_correction.level == "off"
    with pytest.raises(ConfigError, match=r"^algorithm.sampler_correction \('turn'\) and "
                                          r"distributed.correction \('off'\) are one setting "
                                          r"now, algorithm.importance_correction.level"):
        read({"sampler_correction": "turn"}, {"correction": "off"})
    won = read({"sampler_correction": "turn"}, overrides=["distributed.correction=off"])
    assert won.algorithm.importance_correction.level == "off"  # an override wins
    policy = read(policy={"sampler_correction": "off", "sampler_correction_clip": 3.0})
    assert policy.policies["a"].algorithm == {"importance_correction": {"level": "off",
                                                                        "clip": 3.0}}
    with pytest.raises(ConfigError, match=r"^algorithm.sampler_correction and "
                                          r"algorithm.importance_correction.level are one"):
        read({"sampler_correction": "turn", "importance_correction": {"level": "token"}})


def test_a_removed_key_at_its_default_is_dropped_with_a_warning_and_else_refused(caplog):
    saved = {**ENV, "algorithm": {"kl": {"magnet_every": 1}}, "eval": {"exact_vs_minimax": True},
             "league": {"temperature": 0.0}, "policies": {"a": {"kl": {"magnet_every": 1}}}}
    cfg = from_dict(saved, check=False)
    assert to_dict(cfg)["eval"] == to_dict(from_dict(ENV, check=False))["eval"]
    assert "eval.exact_vs_minimax is no longer a setting (removed; it held its default" \
        in caplog.text
    assert "policies.a.kl.magnet_every is no longer a setting" in caplog.text
    for data, overrides, key in [
            ({**ENV, "algorithm": {"kl": {"magnet_every": 150}}}, [], "algorithm.kl.magnet_every"),
            (ENV, ["eval.exact_vs_minimax=false"], "eval.exact_vs_minimax"),
            (ENV, ["league.temperature=2"], "league.temperature")]:
        with pytest.raises(ConfigError, match=rf"^{key} is no longer a setting \(removed; it "
                                              r"was .* by default, this config sets .*\); drop it"):
            from_dict(data, overrides, check=False)


@pytest.mark.parametrize("old, head", [
    ({"optim": {"body_lr_scale": 1.0}, "train": {"feature_cache": 65536}}, {"name": "lm_head"}),
    ({"optim": {"body_lr_scale": 0.25}}, {"name": "lm_head", "body_lr_scale": 0.25}),
    ({"optim": {"body_lr_scale": 0}}, {"name": "frozen_features"}),
    ({"optim": {"body_lr_scale": 0}, "train": {"feature_cache": 0}},
     {"name": "frozen_features", "cache": 0}),
    ({"optim": {"body_lr_scale": 0},
      "train": {"feature_cache": 65536, "feature_center": False, "feature_whiten": 0.1}},
     {"name": "frozen_features", "whiten": 0.1}),
    ({"train": {"feature_cache": 128}}, {"name": "lm_head"}),  # it did nothing
])
def test_old_head_keys_read_as_the_model_head(old, head):
    assert from_dict({**ENV, **old}, check=False).model.head == head


def test_old_head_keys_and_the_model_head(caplog):
    assert from_dict(ENV, ["optim.body_lr_scale=0", "train.feature_center=true"],
                     check=False).model.head == {"name": "frozen_features", "center": True}
    assert "optim.body_lr_scale is the old spelling of model.head: {name: frozen_features}" \
        in caplog.text
    file = {**ENV, "model": {"head": {"name": "frozen_features", "whiten": 0.1}}}
    assert from_dict(file, ["train.feature_cache=8"], check=False).model.head == {
        "name": "frozen_features", "whiten": 0.1, "cache": 8}
    assert from_dict(file, ["optim.body_lr_scale=1"], check=False).model.head == {
        "name": "lm_head"}
    with pytest.raises(ConfigError, match=r"^train.feature_center transforms the features of "
                                          r"a frozen network's cache; it needs model.head"):
        from_dict({**ENV, "train": {"feature_center": True}}, check=False)
    with pytest.raises(ConfigError, match=r"^optim.body_lr_scale and model.head are one "
                                          r"setting"):
        from_dict({**file, "optim": {"body_lr_scale": 0}}, check=False)
    spec = {"policies": {"a": {"optim": {"body_lr_scale": 0, "lr": 0.1}}}}
    assert from_dict(spec, check=False).policies["a"].model == {
        "head": {"name": "frozen_features"}}


def test_old_start_overrides_replace_what_the_file_says_in_either_spelling():
    new = {"envs": [{"name": "tictactoe", "starts": [{"name": "random_opening", "moves": 4},
                                                     {"name": "loss_replay", "share": 0.5}]}]}
    cfg = from_dict(new, ["envs.0.loss_replay=0", "envs.0.opening_moves=2",
                          "envs.0.symmetric_views=true"], check=False)
    assert cfg.envs[0].starts == [{"name": "random_opening", "moves": 2},
                                  {"name": "symmetric_views"}]
    cfg = from_dict(new, ["envs.0.loss_replay_size=8"], check=False)
    assert cfg.envs[0].starts[1] == {"name": "loss_replay", "share": 0.5, "size": 8}
    old = {"envs": [{"name": "tictactoe", "opening_moves": 4}]}
    cfg = from_dict(old, ["envs.0.opening_moves=0", "envs.0.loss_replay=1"], check=False)
    assert cfg.envs[0].starts == [{"name": "loss_replay", "share": 1}]
    cfg = from_dict(old, ["envs.0.starts.0.moves=1"], check=False)  # the file's, renamed
    assert cfg.envs[0].starts == [{"name": "random_opening", "moves": 1}]
    cfg = from_dict({}, ["envs=[{name: tictactoe, opening_moves: 2}]"], check=False)
    assert cfg.envs[0].starts == [{"name": "random_opening", "moves": 2}]


@pytest.mark.parametrize("data, overrides, old, new", [
    ({"envs": [{"name": "tictactoe", "opening_moves": 2,
                "starts": [{"name": "random_opening"}]}]}, [],
     "envs.0.opening_moves", r"envs.0.starts \(its random_opening entry\)"),
    (ENV, ["envs.0.loss_replay=0.5", "envs.0.starts=[]"], "envs.0.loss_replay",
     "envs.0.starts"),
])
def test_an_old_key_and_its_new_spelling_together_are_an_error_naming_both(data, overrides,
                                                                          old, new):
    with pytest.raises(ConfigError, match=rf"^{old} and {new} are one setting"):
        from_dict(data, overrides, check=False)


def test_an_old_override_below_a_whole_new_value_is_an_error():
    with pytest.raises(ConfigError, match=r"^envs.0.opening_moves is the old spelling of "
                                          r"envs.0.starts, which envs also sets"):
        from_dict(ENV, ["envs=[{name: nim}]", "envs.0.opening_moves=2"], check=False)


def test_old_keys_at_their_defaults_say_nothing_even_beside_the_new_spelling():
    data = {"envs": [{"name": "tictactoe", **OLD_ENV_DEFAULTS,
                      "starts": [{"name": "random_opening", "moves": 1}]}]}
    assert from_dict(data, check=False).envs[0].starts == [{"name": "random_opening",
                                                             "moves": 1}]


def test_an_old_style_saved_config_loads_and_resumes_as_its_translation(tmp_path):
    from sparring.config.run_folder import read_run_config

    new = to_dict(from_dict(ENV, ["envs.0.starts=[{name: random_opening, moves: 2}, "
                                 "{name: loss_replay, share: 0.5, size: 64}]",
                                 "exploration.league={rate: 0.5, turns: 1}"]))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old_style(new), sort_keys=False))
    saved = read_run_config(tmp_path / "config.yaml")
    assert to_dict(saved) == new
    check_resume_overrides(saved, from_dict(new))  # no key changed
    again = read_run_config(tmp_path / "config.yaml", ["envs.0.loss_replay=0.25"])
    assert again.envs[0].starts[1] == {"name": "loss_replay", "share": 0.25, "size": 64}


def test_a_run_folder_with_an_old_style_config_resumes_and_evaluates(tmp_path):
    """The product path: `sparring train --resume` and `sparring eval` of a run whose
    config.yaml the previous release wrote (envs[].opening_moves, loss_replay, ...)."""
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
    assert main(["train", "--resume", str(run), "train.steps=3",
                 "envs.0.loss_replay_size=32", "league.explore=0.25"]) == 0
    assert [r["step"] for r in read_metrics(run)][-1] == 3
    resumed = yaml.safe_load((run / "config.yaml").read_text())  # rewritten, new keys
    assert resumed["envs"][0]["starts"][1] == {"name": "loss_replay", "share": 0.5,
                                               "size": 32}
    assert "opening_moves" not in resumed["envs"][0]
    assert resumed["exploration"]["league"]["rate"] == 0.25 and "explore" not in resumed["league"]
    make_old()
    assert main(["eval", str(run), "--vs", "random", "--games", "2"]) == 0


def test_an_old_key_warns_once_per_process(caplog):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from_dict(ENV, ["envs.0.opening_moves=2"], check=False)
        from_dict(ENV, ["envs.0.opening_moves=3"], check=False)
    assert caplog.text.count("envs.0.opening_moves is the old spelling") == 1
