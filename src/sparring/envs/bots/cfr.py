"""CFR and CFR+ over the flat game tree, and a bot that plays the average strategy.

Regret of slot (I, a) for the acting seat p:  r(I, a) += sum_{h in I} pi_{-p}(h) [v_p(h.a) - v_p(h)].
CFR (Zinkevich et al., 2007): simultaneous updates, sigma = regret matching, uniform averaging.
CFR+ (Tammelin, 2014): alternating updates, regrets floored at 0 after each update, the
average strategy weighted by the iteration t. The average strategy converges to a Nash
equilibrium in two-player zero-sum games (Kuhn 2p, Leduc); for 3-player Kuhn there is no
such guarantee (its exploitability still falls below 0.01 in practice; see tests/test_cfr.py).
Each iteration is a few numpy ops per tree level (`GameTree`), no Python loop over nodes.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from sparring.envs.bots.simple import Bot
from sparring.envs.tree import GameTree, game_tree

VARIANTS = ("cfr", "cfr+")


def _regret_matching(tree: GameTree, regret: np.ndarray) -> np.ndarray:
    pos = np.maximum(regret, 0.0)
    tot = np.bincount(tree.slot_infoset, pos, minlength=len(tree.infosets))[tree.slot_infoset]
    return np.where(tot > 0, pos / np.where(tot > 0, tot, 1.0), tree.uniform())


def _update(tree: GameTree, sigma: np.ndarray, seats: list[int], regret: np.ndarray,
            avg: np.ndarray, weight: float) -> None:
    reach = tree.reach(sigma)
    v = tree.values(sigma)
    for p in seats:
        cf = np.prod(np.delete(reach, p, axis=1), axis=1)
        for lv in tree.levels:
            m = lv.decision & (lv.col == p)
            if not m.any():
                continue
            par, ch, sl = lv.parent[m], lv.child[m], lv.slot[m]
            regret += np.bincount(sl, cf[par] * (v[ch, p] - v[par, p]), minlength=tree.n_slots)
            avg += weight * np.bincount(sl, reach[par, p] * sigma[sl], minlength=tree.n_slots)


def solve(game: Any, iterations: int = 1000, variant: str = "cfr+", callback=None,
          **options: Any) -> dict[str, dict[str, float]]:
    """Run ``iterations`` of CFR or CFR+; return the average strategy as
    ``{info_state: {action: prob}}``. ``callback(t, avg_sigma)`` is called every iteration
    when given (e.g. to track exploitability)."""
    if variant not in VARIANTS:
        raise ValueError(f"cfr variant={variant!r}; allowed: {', '.join(VARIANTS)}")
    if iterations < 1:
        raise ValueError(f"cfr iterations must be >= 1, got {iterations}")
    tree = game_tree(game, **options)
    regret = np.zeros(tree.n_slots)
    avg = np.zeros(tree.n_slots)
    for t in range(1, iterations + 1):
        if variant == "cfr":
            _update(tree, _regret_matching(tree, regret), list(range(tree.num_players)),
                    regret, avg, 1.0)
        else:
            for p in range(tree.num_players):
                _update(tree, _regret_matching(tree, regret), [p], regret, avg, float(t))
                np.maximum(regret, 0.0, out=regret)
        if callback is not None:
            callback(t, average(tree, avg))
    return tree.as_dict(average(tree, avg))


def average(tree: GameTree, avg: np.ndarray) -> np.ndarray:
    """Normalise accumulated strategy weights per information set (uniform where zero)."""
    tot = np.bincount(tree.slot_infoset, avg, minlength=len(tree.infosets))[tree.slot_infoset]
    return np.where(tot > 0, avg / np.where(tot > 0, tot, 1.0), tree.uniform())


@functools.lru_cache(maxsize=8)
def _cached(name: str, iterations: int, variant: str, options: tuple) -> dict:
    return solve(name, iterations, variant, **dict(options))


def cfr_policy(game: str, iterations: int = 1000, variant: str = "cfr+", **options: Any):
    """The solved average strategy for a registered game (cached per process)."""
    from sparring.envs import env_entry

    return _cached(env_entry(game).name, iterations, variant, tuple(sorted(options.items())))


class CFRBot(Bot):
    """Samples from the CFR+ average strategy of ``env.info_state(seat)``.

    The strategy is solved on first use for the env's game (``env.name`` and the options
    its tree depends on, ``env.tree_options()``; see `sparring.envs.base.TreeGame`) with
    ``iterations`` CFR+ iterations.
    """

    def __init__(self, iterations: int = 1000, variant: str = "cfr+", seed: int = 0) -> None:
        super().__init__(seed)
        self.iterations = iterations
        self.variant = variant

    def act(self, env: Any, seat: int) -> str:
        legal = self._legal(env, seat)
        probs = cfr_policy(env.name, self.iterations, self.variant,
                           **env.tree_options())[env.info_state(seat)]
        return self.rng.choices(legal, weights=[probs.get(a, 0.0) for a in legal])[0]
