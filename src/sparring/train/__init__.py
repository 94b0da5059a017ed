"""Training: config, learner, loop, checkpoints, metrics.

``train(cfg, model, rollout_fn, eval_fn)`` / ``resume(run_dir, ...)`` run the loop;
`Learner` does the updates; `load_config` reads YAML plus ``key.sub=value`` overrides.
"""

from sparring.train.config import Config, ConfigError, load_config
from sparring.train.learner import Learner, NonFiniteError
from sparring.train.loop import resume, train

__all__ = ["Config", "ConfigError", "Learner", "NonFiniteError", "load_config", "resume", "train"]
