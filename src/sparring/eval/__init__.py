"""Evaluation: exact exploitability (Kuhn, Leduc), the match runner, Wilson intervals, Elo."""

from sparring.eval.exploitability import exploitability, game_tree, nash_conv, uniform_policy
from sparring.eval.matches import MatchResult, Player, Record, play_match, round_robin
from sparring.eval.stats import elo_ratings, wilson

__all__ = ["MatchResult", "Player", "Record", "elo_ratings", "exploitability", "game_tree",
           "nash_conv", "play_match", "round_robin", "uniform_policy", "wilson"]
