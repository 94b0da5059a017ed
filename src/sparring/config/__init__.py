"""Run configuration: dataclasses with a help string per field, YAML + ``key.sub=value``.

`load_config(path, overrides)` builds a `Config` from defaults, an optional YAML file and
command-line overrides (``algorithm.kl.coef=0.05``, ``envs.0.weight=2``,
``algorithm.estimator_options.eps=1e-3``); values are parsed with the field's type.
Unknown keys and bad values raise `ConfigError` naming the key, with a "did you mean"
hint and the allowed values. Registry-backed names (estimator, objective, aggregation,
environment) are checked against their registries by `validate`.

Several policies: ``policies`` names them (`PolicySpec`: the keys of ``model``, ``optim``,
``lora`` and ``algorithm.kl`` that differ for one) and ``envs[].seats`` maps seats to them;
`policy_config(cfg, name)` is the config a policy's model and learner are built from.

The package: `schema` (the dataclasses and their constructors), `checks` (`validate`,
`config_warnings`), `overlay` (`policy_config`), `resume` (`check_resume_overrides`),
`aliases` (old key names, still read) and `files` (recipes and YAML files). Everything is
imported from here.
"""

from sparring.config.checks import config_warnings, validate
from sparring.config.files import (
    MAX_CONFIG_VALUES,
    find_recipe,
    read_yaml,
    recipe_dirs,
    save_config,
)
from sparring.config.overlay import policy_config
from sparring.config.overrides import ConfigError, apply_override
from sparring.config.resume import check_resume_overrides
from sparring.config.schema import (
    AlgorithmConfig,
    ArcherConfig,
    CheckpointConfig,
    Config,
    CriticConfig,
    DistributedConfig,
    EnvSpec,
    EvalConfig,
    ExplorationSpec,
    KLConfig,
    LeagueConfig,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    PolicySpec,
    RolloutConfig,
    TrainConfig,
    commented_yaml,
    from_dict,
    load_config,
    opt,
    to_dict,
)

__all__ = ["MAX_CONFIG_VALUES", "AlgorithmConfig", "ArcherConfig", "CheckpointConfig", "Config",
           "ConfigError", "CriticConfig", "DistributedConfig", "EnvSpec", "EvalConfig",
           "ExplorationSpec", "KLConfig", "LeagueConfig", "LoggingConfig", "LoraConfig", "ModelConfig",
           "OptimConfig", "PolicySpec", "RolloutConfig", "TrainConfig", "apply_override", "check_resume_overrides",
           "commented_yaml", "config_warnings", "find_recipe", "from_dict", "load_config",
           "opt", "policy_config", "read_yaml", "recipe_dirs", "save_config", "to_dict",
           "validate"]
