"""2-GRPO vs 16-GRPO at an equal rollout budget, on verifiable arithmetic.

Claim tested (Wu et al., It Takes Two: Your GRPO Is Secretly DPO, 2025, arXiv:2510.00977):
GRPO with groups of 2 (A = +-1/sqrt(2) when the two rewards differ, a DPO-like winner/loser
update) matches groups of 16 at 1/8 of the rollouts, with about 70% less training time.

Arms (configs/arithmetic_grpo.yaml and configs/arithmetic_2grpo.yaml: tiny model, 1-digit
sums of 2 terms, free-text answers, `grpo`, PPO clip):
  grpo16          16 samples per prompt, 256 episodes a step (16 prompts)
  grpo2           2 samples per prompt, 256 episodes a step (128 prompts): the same
                  rollout budget, 8 times the prompts
  grpo2_eighth    2 samples per prompt, 32 episodes a step (16 prompts, as grpo16): the
                  paper's comparison, 1/8 of grpo16's rollouts
Metrics: the training reward (the fraction of correct sampled answers; the arithmetic
task has no separate evaluation), final value as the mean of the last 10 steps, and its
curves against the step, the episodes seen and the training seconds (time/rollout +
time/update, summed: no start-up, checkpoints or evaluation); the wall time per run.
The time axis is only comparable between runs that shared the machine alike.

Budget (measured with OMP_NUM_THREADS=1 on this 2-core CPU, one run at a time): grpo16
0.24 s/step, grpo2 0.30, grpo2_eighth 0.08; about 8 s of start-up per run.
  3 seeds x 1200 steps x (0.24 + 0.30 + 0.08) + 9 x 8 = 2304 run-seconds
  / 2 jobs = 19.2 min (on an otherwise idle machine).

    python studies/grpo_group_size.py --jobs 2
    python studies/grpo_group_size.py --steps 2 --seeds 0 --out /tmp/studies_smoke/grpo_group_size
"""

import sys

from runner import Arm, main, tail_mean

STEPS = 1200
ARMS = {
    "grpo16": Arm("arithmetic_grpo", ["envs.0.group_size=16", "rollout.episodes_per_step=256"]),
    "grpo2": Arm("arithmetic_2grpo", ["envs.0.group_size=2", "rollout.episodes_per_step=256"]),
    "grpo2_eighth": Arm("arithmetic_2grpo", ["envs.0.group_size=2",
                                             "rollout.episodes_per_step=32"]),
}
METRICS = [tail_mean("reward", 10), tail_mean("invalid_rate", 10)]
CURVES = [("reward", "step"), ("reward", "episodes"), ("reward", "time")]

if __name__ == "__main__":
    sys.exit(main("grpo_group_size", ARMS, METRICS, steps=STEPS, curves=CURVES, doc=__doc__))
