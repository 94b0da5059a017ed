"""Training: config, learner, loop, checkpoints, metrics.

``train(cfg, model, rollout_fn, eval_fn)`` / ``resume(run_dir, ...)`` run the loop;
`Learner` does the updates; `load_config` reads YAML plus ``key.sub=value`` overrides.

The names below load on first use (PEP 562): importing a submodule such as
``sparring.train.checkpoint`` (which the rollouts' opponent pool does) must not pull in the
loop, whose evaluation imports the rollouts back.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"Config": "config", "ConfigError": "config", "load_config": "config",
            "Learner": "learner", "NonFiniteError": "guarded_step",
            "resume": "loop", "train": "loop"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sparring.train' has no attribute {name!r}")
    return getattr(importlib.import_module(f"sparring.train.{_EXPORTS[name]}"), name)
