"""SPIRAL's role-conditioned baseline on and off, and the magnet KL on and off, in self-play.

Claim tested (Liu et al., SPIRAL: Self-Play on Zero-Sum Games Incentivizes Reasoning via
Multi-Agent Multi-Turn Reinforcement Learning, 2025, arXiv:2506.24119; role-conditioned
advantage estimation): without a per-role baseline, self-play training collapses;
with `role_ema` (A = R - b[game, role], b <- 0.95 b + 0.05 mean R, read before the update)
it does not. Second factor: the magnet, a KL pull towards an exponential moving average
of the policy's own weights (R-NaD / magnetic mirror descent, our recipes' stabiliser:
`algorithm.kl.reference=magnet`, k3 estimator).

A 2 x 2 grid per game, pure self-play:
  *_rae_magnet        `role_ema`, magnet KL on (the recipe's coefficient)
  *_rae               `role_ema`, KL off (`algorithm.kl.coef=0`)
  *_reinforce_magnet  `reinforce` (A = R, no baseline: SPIRAL's ablation), magnet KL on
  *_reinforce         `reinforce`, KL off
Kuhn poker: configs/kuhn_selfplay.yaml (magnet coef 0.2, rate 0.01, entropy bonus 0.05,
PPO clip), 400 steps. Tic-tac-toe: configs/default.yaml (magnet coef 0.1, entropy 0.01)
with opponents [self] and 2 epochs, 50 steps only (what the budget leaves; far from the
recipe's 250). Both use PPO clipping, where SPIRAL uses a REINFORCE-style update.

Metrics: Kuhn exploitability (exact; current and average policy) and the mean return
against the CFR equilibrium bot; tic-tac-toe non-loss vs minimax and vs random (400
games, greedy); the policy's token entropy (mean of the last 10 steps: a collapse shows as
entropy falling to 0); wall time per run.

Budget (measured with OMP_NUM_THREADS=1 on this 2-core CPU, one run at a time): Kuhn
0.25 s/step, tic-tac-toe (2 epochs) 2.1 s/step; per run about 12 s of start-up (with the
step-0 evaluation), 0.1 s per Kuhn evaluation (16), 3 s per tic-tac-toe one (2).
  Kuhn:        4 arms x 3 seeds x (400 x 0.25 + 12 + 16 x 0.1) = 1363 s
  tic-tac-toe: 4 arms x 3 seeds x (50 x 2.1 + 12 + 2 x 3) = 1476 s
  total 2839 run-seconds / 2 jobs = 23.7 min (on an otherwise idle machine).

    python studies/role_baseline_magnet.py --jobs 2
    python studies/role_baseline_magnet.py --steps 2 --seeds 0 \\
        --out /tmp/studies_smoke/role_baseline_magnet
"""

import sys

from runner import Arm, main, tail_mean

KUHN_STEPS, TTT_STEPS = 400, 50
GAMES = {
    "kuhn": ("kuhn_selfplay", [], KUHN_STEPS),
    # the recipe as this study runs it: self-play alone, entropy 0.01 (the default recipe
    # differs in both)
    "ttt": ("default", ["envs.0.opponents=[self]", "algorithm.entropy_coef=0.01",
                        "train.epochs=2", "eval.every=25"],
            TTT_STEPS),
}
ESTIMATORS = {"rae": "role_ema", "reinforce": "reinforce"}

ARMS = {
    f"{game}_{short}{'_magnet' if magnet else ''}": Arm(
        recipe, [*base, f"algorithm.estimator={name}", "algorithm.estimator_options={}",
                 *([] if magnet else ["algorithm.kl.coef=0"])], steps)
    for game, (recipe, base, steps) in GAMES.items()
    for short, name in ESTIMATORS.items()
    for magnet in (True, False)
}
METRICS = [
    "eval/kuhn_poker/exploitability",
    "eval/kuhn_poker/exploitability_average",
    "eval/kuhn_poker/cfr/mean_return",
    "eval/tictactoe/minimax/non_loss",
    "eval/tictactoe/random/non_loss",
    tail_mean("entropy", 10),
]
CURVES = [(m, "step") for m in METRICS if isinstance(m, str)] + [("entropy", "step"),
                                                                  ("kl", "step")]

if __name__ == "__main__":
    sys.exit(main("role_baseline_magnet", ARMS, METRICS, steps=KUHN_STEPS, curves=CURVES,
                  doc=__doc__))
