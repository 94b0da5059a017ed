"""The time-average strategy of a run's evaluated policies, and its exploitability.

Self-play by gradient steps need not converge in its last iterate in a zero-sum game
with imperfect information: the policy can circle an equilibrium (bluff more, call more,
bluff less, ...). What the theory of fictitious play, CFR and no-regret self-play says
converges is the *average* strategy of the iterates, averaged in the game's sense: the
player that draws one of the iterates at the start of a game and plays it to the end.
Its behaviour strategy is the reach-weighted average of the iterates
(`sparring.envs.tree.GameTree.average_strategy`).

`StrategyHistory` keeps the strategy table (``sigma``, a probability per (information
state, legal move)) of the policy at each of the last ``window`` evaluations of each game,
and gives the exploitability of their time-average: the key
``<game>/exploitability_time_average`` of `sparring.eval.periodic` (config
``eval.time_average``). It is the strategy of a mixture of the evaluated snapshots, not of
one network: to play it, keep those checkpoints (``checkpoint.every`` equal to
``eval.every``, ``checkpoint.keep`` at least ``window``) and draw one per game. It is a
state of the run (a checkpoint holds it), so a resumed run averages the same snapshots as
one never stopped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sparring.envs.tree import game_tree
from sparring.eval.exploitability import exploitability


class StrategyHistory:
    """Per game, the strategy tables of the last ``window`` evaluations, oldest first."""

    # a checkpoint written before this history existed resumes with an empty one (its
    # time-averages then start again from the resumed step)
    restore_optional = True

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"eval.time_average: a window of {window} evaluations; must be >= 1")
        self.window = window
        self.tables: dict[str, list[tuple[int, np.ndarray]]] = {}

    def record(self, game: str, step: int, sigma: np.ndarray) -> None:
        """The table of ``game`` at ``step``; a step recorded again replaces its table."""
        kept = [(s, t) for s, t in self.tables.get(game, []) if s != step]
        kept.append((step, np.asarray(sigma, dtype=np.float64)))
        kept.sort(key=lambda st: st[0])
        self.tables[game] = kept[-self.window:]

    def steps(self, game: str) -> list[int]:
        return [s for s, _ in self.tables.get(game, [])]

    def exploitability(self, game: str, **options: Any) -> float:
        """Exploitability of the time-average of the recorded tables of ``game``."""
        tables = self.tables.get(game)
        if not tables:
            raise ValueError(f"no strategy of {game!r} recorded yet")
        tree = game_tree(game, **options)
        return exploitability(tree, tree.average_strategy([t for _, t in tables]))

    def state_dict(self) -> dict[str, Any]:
        return {"tables": {g: [[s, t] for s, t in v] for g, v in self.tables.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.tables = {}
        for game, rows in state["tables"].items():
            for step, sigma in rows:
                self.record(game, int(step), np.asarray(sigma, dtype=np.float64))
