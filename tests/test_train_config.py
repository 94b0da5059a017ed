"""Config: YAML + overrides, typed parsing, errors naming the key and the allowed values."""

from pathlib import Path

import pytest
import yaml

from sparring.config import (
    Config,
    ConfigError,
    commented_yaml,
    from_dict,
    load_config,
    save_config,
    to_dict,
)
from tests import train_helpers as th

OK = {"algorithm": {"estimator": "test_centered", "objective": "test_clip"}}
OK_ARGS = ["algorithm.estimator=test_centered", "algorithm.objective=test_clip"]


@pytest.fixture(autouse=True)
def _entries():
    th.register()
    yield
    th.unregister()


def test_yaml_and_overrides_are_typed(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**OK, "envs": [{"name": "tictactoe"}],
                                    "optim": {"lr": 3e-4}}))
    cfg = load_config(path, ["optim.lr=1e-5", "train.steps=7", "lora.enabled=true",
                             "algorithm.kl.coef=0.5", "optim.max_grad_norm=null",
                             "lora.target_modules=q_proj,v_proj", "envs.0.weight=2",
                             "algorithm.estimator_options.eps=0.001", "train.name=123"],
                      check=False)
    assert cfg.optim.lr == 1e-5 and isinstance(cfg.optim.lr, float)
    assert cfg.train.steps == 7 and cfg.lora.enabled is True
    assert cfg.algorithm.kl.coef == 0.5 and cfg.optim.max_grad_norm is None
    assert cfg.lora.target_modules == ["q_proj", "v_proj"]
    assert cfg.envs[0].weight == 2.0 and cfg.envs[0].name == "tictactoe"
    assert cfg.algorithm.estimator_options == {"eps": 0.001}
    assert cfg.train.name == "123"  # a str field keeps the raw text


@pytest.mark.parametrize("args, match", [
    (["algorithm.estimatr=grpo"], r"unknown key 'algorithm.estimatr'; did you mean 'estimator'"),
    (["optimm.lr=1"], r"unknown key 'optimm'; did you mean 'optim'"),
    (["algorithm.kl.reference=magent"], r"algorithm.kl.reference: 'magent'.*did you mean 'magnet'.*allowed: initial, magnet"),
    (["train.steps=ten"], r"train.steps: expected an integer, got 'ten'"),
    (["train.steps=2.5"], r"train.steps: expected an integer"),
    (["optim.lr=fast"], r"optim.lr: expected a number, got 'fast'"),
    (["optim.lr=-1"], r"optim.lr: -1.0 is out of range \(must be > 0\)"),
    (["lora.enabled=maybe"], r"lora.enabled: expected true or false"),
    (["optim.schedule=linear"], r"allowed: constant, warmup, cosine"),
    (["train.steps"], r"bad override 'train.steps': expected key.sub=value"),
    (["=3"], r"bad override '=3'"),
    (["train..steps=3"], r"empty key component"),
    (["train.steps.x=3"], r"train.steps.x: train.steps is a value, not a section"),
    (["envs.0.weight=1"], r"envs.0: no list item '0' \(the list has 0 items\)"),
    (["envs=[{name: kuhn_poker, starts: [{name: symmetric_views}]}]"],
     r"envs.0.starts.0: symmetric_views: SymmetricViews: kuhn_poker declares no symmetries"),
    (["envs=[{name: tictactoe, options: {canonical: true}, starts: [{name: symmetric_views}]}]"],
     r"envs.0.starts.0: symmetric_views: the game's option canonical already shows every "
     r"position in one orientation"),
    (["envs=[{name: tictactoe, starts: [{name: random_opening, moves: -1}]}]"],
     r"envs.0.starts.0: start 'random_opening' option 'moves': -1 is out of range"),
    (["envs=[{name: tictactoe, starts: [{name: random_openings}]}]"],
     r"envs.0.starts.0: unknown start 'random_openings'; known: loss_replay, openings, "
     r"random_opening, symmetric_views"),
    (["envs=[{name: tictactoe, starts: [{name: symmetric_views}, {name: symmetric_views}]}]"],
     r"envs.0.starts.1: 'symmetric_views' is given twice"),
    (["envs=[{name: tictactoe, learner_seats: [0, 2]}]"],
     r"envs.0.learner_seats: \[2\] out of range; tictactoe has seats 0..1"),
    (["exploration.league.rate=1.5"],
     r"exploration.league.rate: 1.5 is out of range \(must be <= 1\)"),
    (["exploration.leage.rate=0.5"],
     r"exploration.leage: no player of that name explores; did you mean 'league'\? "
     r"\(allowed: learner, league\)"),
    (["exploration.league.turns=-1"], r"exploration.league.turns: -1 is out of range"),
    (["exploration.learner.schedule=linear"],
     r"exploration.learner.schedule: 'linear' is not allowed.*\(allowed: constant, cosine\)"),
    (["envs=[{name: kuhn_poker, opponents: [self, pool]}]",
      "exploration.league.tactical=true"],
     r"exploration.league.tactical: kuhn_poker has hidden chance deals.*"
     r"\(envs.0 plays the pool\)"),
    (["envs=[{name: kuhn_poker, opponents: [self]}]", "exploration.learner.tactical=true"],
     r"exploration.learner.tactical: kuhn_poker has hidden chance deals.*"
     r"\(envs.0 is a training game\)"),
    (["league.mode=pfsp", "league.pfsp_power=0"],
     r"league.pfsp_power: 0.0 is out of range \(must be > 0\)"),
    (["lora.last_layers=2"], r"lora.last_layers: places LoRA adapters, and lora.enabled is "
     r"false; set lora.enabled=true too"),
])
def test_bad_overrides_name_the_key(args, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, OK_ARGS + args)


def test_unknown_yaml_key_and_bad_nested_value(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'train.epoch'; did you mean 'epochs'"):
        from_dict({**OK, "train": {"epoch": 2}})
    with pytest.raises(ConfigError, match=r"envs.0.group_size: 0 is out of range \(must be >= 1\)"):
        from_dict({**OK, "envs": [{"name": "x", "group_size": 0}]}, check=False)
    with pytest.raises(ConfigError, match="envs.1: expected a mapping of EnvSpec"):
        from_dict({**OK, "envs": [{"name": "x"}, "y"]}, check=False)
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(path)


def test_registry_names_are_checked_and_list_the_known_ones():
    with pytest.raises(ConfigError, match=r"algorithm.estimator: unknown estimator 'grpoo'; "
                                          r"known: .*test_centered"):
        from_dict({"algorithm": {"estimator": "grpoo", "objective": "test_clip"}})
    with pytest.raises(ConfigError, match=r"algorithm.objective: unknown objective 'nope'; "
                                          r"known: .*test_clip"):
        from_dict({"algorithm": {"estimator": "test_centered", "objective": "nope"}})
    with pytest.raises(ConfigError, match=r"algorithm.aggregation: unknown aggregation 'mean'"):
        from_dict({**OK, "algorithm": {**OK["algorithm"], "aggregation": "mean"}})
    with pytest.raises(ConfigError, match=r"algorithm.shaping.0.name: unknown shaper 'zzz'"):
        from_dict({"algorithm": {**OK["algorithm"], "shaping": [{"name": "zzz"}]}})
    with pytest.raises(ConfigError, match=r"algorithm.shaping.0: expected \{name"):
        from_dict({"algorithm": {**OK["algorithm"], "shaping": [{"nam": "zzz"}]}})
    with pytest.raises(ConfigError, match=r"envs.0.name: unknown environment 'no_such_env'"):
        from_dict({**OK, "envs": [{"name": "no_such_env"}]})
    with pytest.raises(ConfigError, match="microbatch_size: must not exceed"):
        from_dict({**OK, "train": {"minibatch_size": 4, "microbatch_size": 8}})


def test_saved_config_round_trips(tmp_path):
    cfg = from_dict(OK, ["optim.lr=2e-3", "algorithm.kl.reference=magnet"])
    save_config(cfg, tmp_path / "config.yaml")
    back = load_config(tmp_path / "config.yaml")
    assert back == cfg and isinstance(back, Config)
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["optim"]["lr"] == 2e-3


def test_reference_config_file_matches_the_defaults():
    text = (Path(__file__).parents[1] / "configs" / "reference.yaml").read_text()
    assert text.strip().endswith(commented_yaml().strip()), "regenerate configs/reference.yaml"
    assert yaml.safe_load(text) == to_dict(Config())
    assert "# peak learning rate" in text


def test_every_config_file_has_only_known_keys():
    files = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))
    assert files
    for path in files:  # keys only: registry names are checked where they are built
        load_config(path, check=False)


def test_unknown_estimator_or_objective_option_names_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"algorithm.objective_options: .*no option 'eps'.*"
                                          r"did you mean 'eps_low'.*allowed: dual_clip, eps_high"):
        from_dict({"envs": [{"name": "tictactoe"}]}, ["algorithm.objective_options.eps=0.2"])
    with pytest.raises(ConfigError, match=r"envs.0.estimator_options: estimator 'grpo' has no "
                                          r"option 'agent_key'"):
        from_dict({"envs": [{"name": "tictactoe", "estimator_options": {"agent_key": True}}]})


def _config_fields(cls=Config, prefix=""):
    """(dotted key, field name) of every field of the config tree, nested dataclasses and
    lists of them (``envs``) included."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        yield prefix + f.name, f.name
        for t in (hints[f.name], *typing.get_args(hints[f.name])):
            if dataclasses.is_dataclass(t):
                yield from _config_fields(t, prefix + f.name + ".")


def test_every_config_field_is_read_somewhere():
    """A config field nothing reads is a promise the code does not keep (a ``bfloat16``
    that trains in float32). Rule: for every field of the config tree, an attribute access
    ``.<name>`` appears in some module of src/sparring outside the config package, where
    the fields are declared and checked (its rollout plan, `sparring.config.plan`, reads
    them and counts). A source scan, so a generic name (``options``)
    passes through any field of that name; a field with a distinct name cannot go unread."""
    import re

    src = Path(__file__).parents[1] / "src" / "sparring"
    declared = src / "config"
    assert declared.is_dir()
    code = "\n".join(p.read_text(encoding="utf-8") for p in src.rglob("*.py")
                     if declared not in p.parents or p.name == "plan.py")
    unread = [key for key, name in _config_fields() if not re.search(rf"\.{name}\b", code)]
    assert not unread, f"config fields read nowhere: {unread}"


# ---------------------------------------------------------------- invalid values, named

ENV = {"envs": [{"name": "tictactoe"}]}


@pytest.mark.parametrize("args, match", [
    (["algorithm.estimator=gae", "critic.enabled=off"],
     r"critic.enabled: estimator 'gae' needs values"),
    (["eval.opponents=[random,zz]"], r"eval.opponents.1: unknown opponent 'zz'.*allowed: .*random"),
    (["league.bots=[foo]"], r"league.bots.0: unknown opponent 'foo'"),
    (["envs.0.opponents=[self,randm]"], r"envs.0.opponents.1: unknown opponent 'randm'; "
                                        r"did you mean 'random'"),
    (["envs.0.options.bogus=1"], r"envs.0.options: tictactoe has no option 'bogus' "
                                 r"\(allowed: compact, canonical, numbered, lines\)"),
    (["envs.0.name=calculator", "envs.0.options.max_calls=0"],
     r"envs.0.options: calculator rejects .*max_calls=0; must be >= 1"),
    (["envs.0.name=calculator", "envs.0.options.max_call=2"],
     r"envs.0.options: calculator has no option 'max_call'; did you mean 'max_calls'"),
    (["model.device=banana"], r"model.device: 'banana' is not a device"),
    (["model.device=cuda:x"], r"model.device: 'cuda:x' is not a device"),
    (["model.options.hidden=32"], r"model.options: the tiny model has no option 'hidden'; "
                                  r"did you mean 'hidden_size'"),
    (["model.options.num_layers=two"], r"model.options.num_layers: expected int, got 'two'"),
    (["model.options.num_layers=0"], r"model.options.num_layers: 0 is out of range"),
    (["model.options.hidden_size=30"], r"model.options: hidden_size=30 must be divisible"),
    (["train.run_dir={nam}"], r"train.run_dir: '\{nam\}' is not a valid pattern "
                              r"\(unknown field \{nam\}\)"),
    (["train.run_dir=runs/{name"], r"train.run_dir: 'runs/\{name' is not a valid pattern"),
    ([f"train.seed={2**32}"], r"train.seed: 4294967296 is out of range \(must be <= 4294967295\)"),
    (["train.seed=-1"], r"train.seed: -1 is out of range \(must be >= 0\)"),
    (["envs.0.opponents=[pool]", "league.bots=[]"],
     r"envs.0.opponents: 'pool' .*league.bots is empty.*league.every is 0"),
    (["envs.0.opponents=[pool]", "league.bots=[]", "league.every=5"],
     r"envs.0.opponents: 'pool' .*nothing to sample before its first snapshot"),
    (["optim.betas=[0.9,1.0]"], r"optim.betas: expected two numbers in \[0, 1\)"),
    (["optim.lr=.inf"], r"optim.lr: expected a finite number, got inf"),
    (["optim.lr=nan"], r"optim.lr: expected a finite number, got nan"),
    (["rollout.invalid_penalty=-inf"], r"rollout.invalid_penalty: expected a finite number"),
])
def test_invalid_configs_fail_in_validate_naming_the_key(args, match):
    with pytest.raises(ConfigError, match=match):
        from_dict(ENV, args)


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  steps: [1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: not valid YAML at line 3, column 1"):
        load_config(path)


def test_on_and_off_are_choices_not_booleans(tmp_path):
    """YAML 1.1 reads a bare `off` as false; `critic.enabled=off` means the choice 'off'."""
    assert from_dict(ENV, ["critic.enabled=off"]).critic.enabled == "off"
    assert from_dict(ENV, ["critic.enabled=on"]).critic.enabled == "on"
    path = tmp_path / "c.yaml"
    path.write_text("envs: [{name: tictactoe}]\ncritic: {enabled: off}\n")
    assert load_config(path).critic.enabled == "off"
    with pytest.raises(ConfigError, match="lora.enabled: expected true or false"):
        from_dict(ENV, ["lora.enabled=maybe"])  # a bool field is still a bool


def test_warnings_for_ignored_warmup_rounded_episodes_idle_opponents_and_one_episode_groups():
    from sparring.config import config_warnings

    cfg = from_dict({"envs": [{"name": "tictactoe", "group_size": 16,
                               "opponents": ["self", "random"]}]},
                    ["rollout.episodes_per_step=10"])
    notes = config_warnings(cfg)
    assert any("episodes_per_step=10 is rounded to whole groups (envs.0.group_size=16): "
               "each step plays 16 episodes" in n for n in notes)
    assert any("envs.0.opponents: 1 group(s) a step for 2 opponent kinds: random get no "
               "episodes" in n for n in notes)
    grpo = from_dict({"envs": [{"name": "tictactoe"}]},
                     ["algorithm.estimator=grpo", "rollout.episodes_per_step=8"])
    assert any(n.startswith("envs.0.group_size=1: estimator 'grpo'") for n in
               config_warnings(grpo))
    fine = from_dict({"envs": [{"name": "tictactoe", "group_size": 4}]},
                     ["algorithm.estimator=grpo", "rollout.episodes_per_step=8"])
    assert config_warnings(fine) == []
    constant = from_dict({"envs": [{"name": "tictactoe", "group_size": 4}]},
                         ["rollout.episodes_per_step=8", "optim.warmup_steps=5"])
    assert config_warnings(constant) == [
        "optim.warmup_steps=5 is ignored: optim.schedule='constant' has no warm-up "
        "('warmup' is a warm-up, then constant)"]
    warm = from_dict({"envs": [{"name": "tictactoe", "group_size": 4}]},
                     ["rollout.episodes_per_step=8", "optim.warmup_steps=5",
                      "optim.schedule=warmup"])
    assert config_warnings(warm) == []
    two = from_dict({"envs": [{"name": "tictactoe", "group_size": 4, "seats": ["a", "b"]}],
                     "policies": {"a": {}, "b": {"optim": {"warmup_steps": 3}}}},
                    ["rollout.episodes_per_step=8", "optim.warmup_steps=5"])
    assert [n.split(" is ")[0] for n in config_warnings(two)] == [
        "optim.warmup_steps=5", "policies.b.optim.warmup_steps=3"]


def test_resume_overrides_that_change_the_model_are_refused():
    from sparring.config import check_resume_overrides

    saved = from_dict(ENV)
    check_resume_overrides(saved, from_dict(ENV, ["train.steps=500", "optim.lr=1e-3",
                                                  "model.device=cpu", "eval.games=10"]))
    for args, key in ((["model.options.hidden_size=32"], "model.options.hidden_size"),
                      (["model.name=smollm2"], "model.name"),
                      (["lora.enabled=true"], "lora.enabled"),
                      (["lora.r=4"], "lora.r"),
                      (["critic.hidden=8"], "critic.hidden"),
                      (["algorithm.kl.reference=magnet"], "algorithm.kl.reference"),
                      (["league.bots=[minimax]"], "league.bots"),
                      (["model.trust_remote_code=true"], "model.trust_remote_code")):
        with pytest.raises(ConfigError, match=rf"^{key}: cannot change on --resume"):
            check_resume_overrides(saved, from_dict(ENV, args))


def test_a_built_in_model_name_wins_over_a_folder_of_that_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("tiny").mkdir()  # a folder that is no model
    assert load_config(None, OK_ARGS).model.name == "tiny"  # the built-in model
    with pytest.raises(ConfigError, match=r"^model.name: './tiny' has no config.json; give a "
                       "Hugging Face model folder"):
        load_config(None, OK_ARGS + ["model.name=./tiny"])
