"""Evaluation: exact exploitability (games that declare their tree: Kuhn, Leduc), the match
runner (on the arena), Wilson intervals, Elo. A model policy against bots and its
exploitability: `sparring.eval.games`; a training run's periodic evaluation:
`sparring.eval.periodic`; the fixed point an entropy bonus pulls self-play towards:
`sparring.eval.logit_equilibrium`."""

from sparring.envs.tree import game_tree
from sparring.eval.exploitability import exploitability, nash_conv, uniform_policy
from sparring.eval.matches import MatchResult, Record, play_match, round_robin
from sparring.eval.stats import elo_ratings, wilson

__all__ = ["MatchResult", "Record", "elo_ratings", "exploitability", "game_tree", "nash_conv",
           "play_match", "round_robin", "uniform_policy", "wilson"]
