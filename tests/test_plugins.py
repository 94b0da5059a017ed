"""Plugins: a module outside the package registers an env, an estimator, an objective and a
shaper with the ordinary decorators; `sparring train --plugin` and the config's `plugins`
key import it before the config is checked, and a 1-step run uses all four."""

import json
import sys
import textwrap

import pytest
import yaml

from sparring import Config, Trainer
from sparring.cli import main
from sparring.config import ConfigError, load_config

PLUGIN = textwrap.dedent('''
    """A user's plugin: one env, one estimator, one objective, one reward shaper."""
    import torch

    from sparring.advantages import estimator
    from sparring.advantages.shaping import shaper, with_row_delta
    from sparring.envs import register_env
    from sparring.envs.base import StepResult
    from sparring.envs.parsing import parse_choice
    from sparring.objectives import objective

    CALLS = {"env": 0, "estimator": 0, "objective": 0, "shaper": 0}


    class SayA:
        name, num_seats = "plugin_say_a", 1

        def reset(self, seed):
            self.done, self.ret = False, 0.0
            CALLS["env"] += 1

        def current_seat(self):
            return None if self.done else 0

        def system_prompt(self, seat):
            return ""

        def observation(self, seat):
            return "a or b?"

        def legal_actions(self, seat):
            return [] if self.done else ["a", "b"]

        def parse(self, seat, text):
            return parse_choice(text, self.legal_actions(seat))

        def step(self, action):
            self.done, self.ret = True, float(action == "a")
            return StepResult([self.ret], True, {})

        def state_key(self):
            return "end" if self.done else "start"

        def returns(self):
            return [self.ret]


    @register_env("plugin_say_a", family="task", source="a test plugin")
    def make_say_a():
        return SayA()


    @estimator("plugin_centered", family="test", needs=("group",))
    def plugin_centered(batch, *, scale: float = 1.0):
        """A = scale (R - mean R), on action tokens."""
        CALLS["estimator"] += 1
        r = batch.returns.float()
        return (scale * (r - r.mean()))[:, None] * batch.action_mask


    @objective("plugin_pg", family="test")
    def plugin_pg(logp, old_logp, advantages, mask, *, ref_logp=None):
        """-A log p on action tokens."""
        CALLS["objective"] += 1
        return -(logp * advantages) * mask, {}


    @shaper("plugin_bonus", kind="reward")
    def plugin_bonus(batch, *, bonus: float = 0.5):
        """Adds ``bonus`` to every row's reward."""
        CALLS["shaper"] += 1
        return with_row_delta(batch, torch.full_like(batch.reward, bonus))
''')

NAMES = {"envs": ["plugin_say_a"], "estimators": ["plugin_centered"],
         "objectives": ["plugin_pg"], "shapers": ["plugin_bonus"]}


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The plugin written outside the package, its folder on sys.path; afterwards its
    registry entries, module and file record are removed again."""
    from sparring import plugins
    from sparring.advantages import ESTIMATORS
    from sparring.advantages.shaping import SHAPERS
    from sparring.envs import ENVS
    from sparring.objectives import OBJECTIVES

    folder = tmp_path / "user_code"
    folder.mkdir()
    (folder / "my_sparring_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(folder))
    yield folder / "my_sparring_plugin.py"
    for reg, key in ((ENVS, "envs"), (ESTIMATORS, "estimators"), (OBJECTIVES, "objectives"),
                     (SHAPERS, "shapers")):
        for name in NAMES[key]:
            reg._entries.pop(name, None)
    sys.modules.pop("my_sparring_plugin", None)
    for path in [p for p in plugins._BY_FILE if p.parent == folder]:
        del plugins._BY_FILE[path]


def _recipe(tmp_path, **extra):
    cfg = {
        "model": {"name": "tiny", "options": {"hidden_size": 32, "num_layers": 1,
                                              "num_heads": 2, "num_kv_heads": 1,
                                              "intermediate_size": 64}},
        "envs": [{"name": "plugin_say_a", "group_size": 4}],
        "rollout": {"episodes_per_step": 8, "max_new_tokens": 2, "system_prompt": ""},
        "algorithm": {"estimator": "plugin_centered", "estimator_options": {"scale": 2.0},
                      "objective": "plugin_pg", "shaping": [{"name": "plugin_bonus"}]},
        "train": {"steps": 1, "run_dir": str(tmp_path / "run")},
        "eval": {"opponents": [], "at_start": False},
        "logging": {"progress": False},
        **extra,
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _row(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_cli_plugin_option_trains_one_step(plugin, tmp_path, capsys):
    recipe = _recipe(tmp_path)
    with pytest.raises(ConfigError, match="unknown estimator 'plugin_centered'"):
        load_config(recipe)  # not imported yet: the names are unknown
    assert main(["train", "--plugin", "my_sparring_plugin", str(recipe)]) == 0
    calls = sys.modules["my_sparring_plugin"].CALLS
    assert calls["env"] >= 8 and calls["estimator"] >= 1 and calls["objective"] >= 1
    assert calls["shaper"] >= 1
    run = tmp_path / "run"
    rows = _row(run)
    assert [r["step"] for r in rows] == [1] and rows[0]["episodes"] == 8
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["plugins"] == ["my_sparring_plugin"]  # eval / resume / export import it again
    assert load_config(run / "config.yaml").algorithm.estimator == "plugin_centered"
    capsys.readouterr()
    assert main(["list", "--plugin", "my_sparring_plugin", "estimators"]) == 0
    assert "plugin_centered" in capsys.readouterr().out


def test_config_key_imports_a_plugin_file(plugin, tmp_path):
    """``plugins: [path/to/file.py]`` in the YAML; the run through the Python API."""
    recipe = _recipe(tmp_path, plugins=[str(plugin)])
    sys.path.remove(str(plugin.parent))  # found by its path, not on sys.path
    cfg = Config.load(str(recipe))
    assert cfg.algorithm.objective == "plugin_pg"
    steps = []
    Trainer(cfg, on_step=lambda s, m: steps.append(s)).fit()
    assert steps == [1]
    assert sys.modules["my_sparring_plugin"].CALLS["estimator"] >= 1
    Config.load(str(recipe))  # importing it again is a no-op, not a second registration


def test_bad_plugins_are_one_line_errors(tmp_path, capsys):
    assert main(["train", "--plugin", "no_such_plugin_mod", "train.steps=1"]) == 2
    err = capsys.readouterr().err
    assert "plugin 'no_such_plugin_mod': cannot import it" in err and "PYTHONPATH" in err
    with pytest.raises(ConfigError, match=r"plugins: plugin '.*missing\.py'.*no such file"):
        load_config(None, [f"plugins=[{tmp_path / 'missing.py'}]"])
    assert main(["list", "--plugin", "no_such_plugin_mod"]) == 2
