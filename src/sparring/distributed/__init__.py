"""Rollout workers and learner ranks on Ray (optional extra: ``pip install 'sparring[ray]'``).

``distributed.rollout_workers=N`` runs a run's rollouts on N Ray actors while the learner
stays in the training process (the driver): `RayRollouts` is the rollout function the
training loop calls, `RolloutWorker` what each actor runs, `split_groups` who plays which
groups, `sparring.distributed.weights` how new weights reach the workers (object store or
a NCCL/gloo broadcast); `sparring.importance` has the off-policy correction of async mode.
``distributed.learner_ranks=N`` makes the training process rank 0 of N data-parallel
learner ranks, the others Ray actors (`RayLearnerRanks`; the run on ranks:
`sparring.train.learner_ranks`). docs/cluster.md says how to run it on one machine or a
cluster.

Ray is imported only when workers are started: without it, `sparring.config`
rejects any ``distributed.*`` setting with the install command.
"""

from sparring.distributed.learner_ranks import LearnerRankActor, RayLearnerRanks
from sparring.distributed.rollouts import INSTALL_HINT, RayRollouts, require_ray
from sparring.distributed.split import split_groups
from sparring.distributed.worker import RolloutWorker

__all__ = ["INSTALL_HINT", "LearnerRankActor", "RayLearnerRanks", "RayRollouts",
           "RolloutWorker", "require_ray", "split_groups"]
