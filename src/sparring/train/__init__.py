"""Training: the learner's update (`Learner`), the step and the run's lifecycle
(`train`, `resume`), checkpoints and metrics.

The run's parts (model, rollouts, evaluation) are built above this package
(`sparring.assembly`); the configuration is below it (`sparring.config`).
"""

from sparring.train.guarded_step import NonFiniteError
from sparring.train.learner import Learner
from sparring.train.loop import resume, train

__all__ = ["Learner", "NonFiniteError", "resume", "train"]
