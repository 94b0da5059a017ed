"""GiGPO vs GRPO on FrozenLake and Sokoban.

Claim tested (Feng et al., Group-in-Group Policy Optimization for LLM Agent Training, 2025,
arXiv:2505.10978; GiGPO): where states repeat across a group's episodes, adding a
step-level advantage over turns taken from the same anchor state
(A = A_episode + omega * A_step) beats GRPO's episode-level advantage alone (ALFWorld,
WebShop, Sokoban in the paper).

Arms (configs/frozenlake_gigpo.yaml: tiny model, groups of 8 episodes from one start
state, constrained moves, PPO clip, 2 epochs):
  frozenlake_gigpo / frozenlake_grpo   4x4 FrozenLake (random layouts, not slippery),
                                       128 episodes a step
  sokoban_gigpo / sokoban_grpo         6x6 Sokoban with one box (reverse-play levels),
                                       at most 15 moves, 64 episodes a step (the default
                                       30 moves and 128 episodes cost 12 s a step)
`gigpo` with omega 1, discount 0.95 and `truncated: terminal`; `grpo` with its defaults.
gigpo's default `truncated: mask` (the shipped recipe's) leaves the episodes stopped by the
move budget out of the loss, while grpo scores them 0: in Sokoban, where only a solved
level ends an episode early, the kept episodes would all be successes and A_episode 0, so
both arms here count a truncated episode as a failure.
Metrics: the training success rate (`reward`; the tasks have no separate evaluation),
final value as the mean of the last 10 steps; the episode length (turns); curves against
the step; the wall time per run.

Budget (measured with OMP_NUM_THREADS=1 on this 2-core CPU, one run at a time):
FrozenLake 2.75 s/step, Sokoban (15 moves, 64 episodes) 2.5 s/step, about 8 s of start-up
per run (the first steps run slower, about 2x).
  3 seeds x 2 estimators x 80 steps x (2.75 + 2.5) + 12 x 8 = 2616 run-seconds
  / 2 jobs = 21.8 min (on an otherwise idle machine).

    python studies/gigpo_vs_grpo.py --jobs 2
    python studies/gigpo_vs_grpo.py --steps 2 --seeds 0 --out /tmp/studies_smoke/gigpo_vs_grpo
"""

import sys

from runner import Arm, main, tail_mean

STEPS = 80
SOKOBAN = ["envs.0.name=sokoban", "envs.0.options={max_steps: 15}",
           "rollout.episodes_per_step=64"]
GIGPO = ["algorithm.estimator_options={truncated: terminal}"]
GRPO = ["algorithm.estimator=grpo"]
ARMS = {
    "frozenlake_gigpo": Arm("frozenlake_gigpo", GIGPO),
    "frozenlake_grpo": Arm("frozenlake_gigpo", GRPO),
    "sokoban_gigpo": Arm("frozenlake_gigpo", [*SOKOBAN, *GIGPO]),
    "sokoban_grpo": Arm("frozenlake_gigpo", [*SOKOBAN, *GRPO]),
}
METRICS = [tail_mean("reward", 10), tail_mean("episode_length", 10)]
CURVES = [("reward", "step"), ("episode_length", "step"), ("reward", "time")]

if __name__ == "__main__":
    sys.exit(main("gigpo_vs_grpo", ARMS, METRICS, steps=STEPS, curves=CURVES, doc=__doc__))
