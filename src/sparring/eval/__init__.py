"""Evaluation: exact exploitability for poker games and the match runner."""

from sparring.eval.exploitability import exploitability, game_tree, nash_conv, uniform_policy

__all__ = ["exploitability", "game_tree", "nash_conv", "uniform_policy"]
