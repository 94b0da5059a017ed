"""MARS in miniature: trajectory-level GRPO vs turn-level return-to-go, with and without
per-(group, seat) normalisation, in self-play.

Claim tested (MARS: Reinforcing Multi-Agent Reasoning of LLMs through Self-Play in
Strategic Games, Yuan et al. 2025, arXiv:2510.15414): a turn-level advantage estimator with
agent-specific advantage normalisation beats trajectory-level GRPO in self-play, and the
self-play transfers to held-out games (up to +28.7%).

Arms, per game (all pure self-play, `envs.0.opponents=[self]`):
  *_traj_grpo        `grpo`: A_i = (R_i - mean_g R) / std_g R, one value per trajectory
                     (our grpo always groups by (group, seat), so it is seat-aware too)
  *_turn_group       `turn_rtg`, scope=group: return-to-go over the seat's own turns,
                     normalised over all turns of the group, both seats pooled
  *_turn_group_agent `turn_rtg`, scope=group_agent: the same, per (group, seat): MARS
Tic-tac-toe: configs/default.yaml (magnet KL, entropy bonus, cosine lr) with opponents
[self] and 2 epochs (4 in the recipe) to fit the budget; std normalisation, as the recipe.
Kuhn poker: configs/kuhn_selfplay.yaml; mean-only centring in every arm (the recipe's
`std: false`; `grpo` with `scale: false`), so the arms differ only in the level and scope.
Both games reward only the final move, so with discount 1 the return-to-go of every turn
of a seat is that seat's final return: turn- and trajectory-level then differ only in
whether the statistics count turns or trajectories, and the scope is the real contrast.

Metrics: non-loss vs minimax and vs random (400 games each, greedy), Kuhn exploitability
(exact; of the current and the average policy). Held-out games, evaluated after training
from the final checkpoint (greedy, 100 games per bot, seats alternating): the tic-tac-toe
policies play Connect Four vs MCTS (200 simulations) and vs random (Connect Four has no
compact observation, so its text differs from the compact board they trained on); the
Kuhn policies' exact exploitability in Leduc poker (compact; uniform play: 2.37).

Budget (measured with OMP_NUM_THREADS=1 on this 2-core CPU, one run at a time):
tic-tac-toe (2 epochs) 2.1 s/step, Kuhn 0.25 s/step; per run about 12 s of start-up
(imports, model, the step-0 evaluation), 3 s per later tic-tac-toe evaluation (4 of them),
0.1 s per Kuhn one (16); held-out: 13 s per Connect Four, 6 s per Leduc evaluation.
  tic-tac-toe: 3 arms x 3 seeds x (80 x 2.1 + 12 + 4 x 3) = 1728 s
  Kuhn:        3 arms x 3 seeds x (400 x 0.25 + 12 + 16 x 0.1) = 1022 s
  held-out:    9 x 13 + 9 x 6 = 171 s
  total 2921 run-seconds / 2 jobs = 24.3 min (on an otherwise idle machine; two runs on
  two cores that other work also uses go slower).

    python studies/mars_miniature.py --jobs 2
    python studies/mars_miniature.py --steps 2 --seeds 0 --out /tmp/studies_smoke/mars_miniature
"""

import json
import sys
from pathlib import Path

from runner import Arm, Job, main

# the recipe as this study runs it: self-play alone, entropy 0.01 (the default recipe
# differs in both)
TTT = ["envs.0.opponents=[self]", "algorithm.entropy_coef=0.01", "train.epochs=2",
       "eval.every=20"]
TURN = "algorithm.estimator=turn_rtg"  # the default recipe's estimator is turn_gae
KUHN: list[str] = []
TTT_STEPS, KUHN_STEPS = 80, 400

ARMS = {
    "ttt_traj_grpo": Arm("default", [*TTT, "algorithm.estimator=grpo",
                                     "algorithm.estimator_options={}"], TTT_STEPS),
    "ttt_turn_group": Arm("default", [*TTT, TURN, "algorithm.estimator_options={scope: group}"],
                          TTT_STEPS),
    "ttt_turn_group_agent": Arm("default", [*TTT, TURN, "algorithm.estimator_options="
                                           "{scope: group_agent}"], TTT_STEPS),
    "kuhn_traj_grpo": Arm("kuhn_selfplay", [*KUHN, "algorithm.estimator=grpo",
                                            "algorithm.estimator_options={scale: false}"],
                          KUHN_STEPS),
    "kuhn_turn_group": Arm("kuhn_selfplay", [*KUHN, "algorithm.estimator_options="
                                             "{scope: group, std: false}"], KUHN_STEPS),
    "kuhn_turn_group_agent": Arm("kuhn_selfplay", [*KUHN, "algorithm.estimator_options="
                                                   "{scope: group_agent, std: false}"],
                                 KUHN_STEPS),
}

HELDOUT = "heldout.json"
HELDOUT_GAMES = 100
# run in a subprocess: RUN_DIR GAMES -> RUN_DIR/heldout.json
EVAL_CODE = r"""
import json, sys
from sparring.envs.bots import make_bot
from sparring.eval.games import evaluate_vs_bot, policy_exploitability
from sparring.policy.sampling import SamplingParams
from sparring.rollout.rollouts import make_arena
from sparring.assembly.trained import load_policies
run, games = sys.argv[1], int(sys.argv[2])
policies, cfg, ckpt = load_policies(run)
policy, arena = policies[""], make_arena(cfg.rollout)
trained = cfg.envs[0].name
out = {"checkpoint": str(ckpt)}
if trained == "kuhn_poker":
    out["leduc/exploitability"] = policy_exploitability(arena, policy, "leduc", {"compact": True})
else:
    sampling = SamplingParams(temperature=1.0, greedy=True,
                              max_new_tokens=max(cfg.rollout.max_new_tokens, 2))
    for bot in ("mcts", "random"):
        r = evaluate_vs_bot(arena, policy, sampling, "connect_four", {}, make_bot(bot, 0),
                            games, seed=0)
        out[f"connect_four/{bot}/non_loss"] = r["non_loss"]
json.dump(out, open(f"{run}/heldout.json", "w"))
"""


def heldout_jobs(runs, args) -> list[Job]:
    """One held-out evaluation per finished run (skipped when its heldout.json exists)."""
    return [Job(f"held-out eval {r.arm} seed {r.seed}",
                [sys.executable, "-c", EVAL_CODE, str(r.dir), str(HELDOUT_GAMES)],
                r.dir / "heldout.log", (r.dir / HELDOUT).exists) for r in runs]


def heldout(key: str):
    def fn(run_dir: Path) -> float | None:
        path = run_dir / HELDOUT
        return json.loads(path.read_text()).get(key) if path.exists() else None
    return f"held-out {key}", fn


METRICS = [
    "eval/tictactoe/minimax/non_loss",
    "eval/tictactoe/random/non_loss",
    "eval/kuhn_poker/exploitability",
    "eval/kuhn_poker/exploitability_average",
    heldout("connect_four/mcts/non_loss"),
    heldout("connect_four/random/non_loss"),
    heldout("leduc/exploitability"),
]
CURVES = [(m, "step") for m in METRICS if isinstance(m, str)] + [("entropy", "step")]

if __name__ == "__main__":
    sys.exit(main("mars_miniature", ARMS, METRICS, steps=TTT_STEPS, curves=CURVES,
                  doc=__doc__, after=heldout_jobs))
