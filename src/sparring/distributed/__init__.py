"""Rollout workers on Ray (optional extra: ``pip install 'sparring[ray]'``).

``distributed.rollout_workers=N`` runs a run's rollouts on N Ray actors while the learner
stays in the training process (the driver): `RayRollouts` is the rollout function the
training loop calls, `RolloutWorker` what each actor runs, `split_groups` who plays which
groups, `sparring.distributed.weights` how new weights reach the workers (object store or
a NCCL/gloo broadcast); `sparring.importance` has the off-policy correction of async mode.
docs/cluster.md says how to run it on one machine or a cluster.

Ray is imported only when workers are started: without it, `sparring.config`
rejects any ``distributed.*`` setting with the install command.
"""

from sparring.distributed.rollouts import INSTALL_HINT, RayRollouts, require_ray
from sparring.distributed.split import split_groups
from sparring.distributed.worker import RolloutWorker

__all__ = ["INSTALL_HINT", "RayRollouts", "RolloutWorker", "require_ray", "split_groups"]
