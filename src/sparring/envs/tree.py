"""The full game tree of a small imperfect-information game, as flat numpy arrays.

Built once from an environment that exposes ``deal_outcomes()`` (equally likely deals),
``reset_deal(deal)``, ``info_state(seat)`` and ``clone()`` (Kuhn, Leduc). The root is a
chance node over deals; every other node is a decision or a terminal. Decision nodes are
grouped into information sets; each (infoset, action) pair is one "slot" of a flat array,
so a policy is a vector ``sigma[n_slots]``. Edges are grouped by the depth of their parent
so that reach probabilities (forward) and values (backward) are a few numpy ops per level.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np


def _ratio(num: np.ndarray, den: np.ndarray, fallback: Any) -> np.ndarray:
    """``num / den`` where ``den > 0``, else ``fallback``."""
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), fallback)


@dataclass
class Level:
    """Edges whose parent is at one depth. ``col``: the acting seat, or P for chance."""

    parent: np.ndarray
    child: np.ndarray
    col: np.ndarray
    slot: np.ndarray  # flat (infoset, action) index; -1 for chance edges
    prob: np.ndarray  # chance probability; 0 for decision edges
    decision: np.ndarray  # bool mask: slot >= 0


class GameTree:
    """Flat tree: ``infosets[i]`` (string), ``actions[i]`` (legal action strings),
    ``player[i]``; slots ``offset[i]:offset[i+1]``; ``utility[n_nodes, P]`` at terminals."""

    def __init__(self, env: Any) -> None:
        for need in ("deal_outcomes", "reset_deal", "info_state", "clone"):
            if not hasattr(env, need):
                raise TypeError(f"{type(env).__name__} has no {need}(); cannot build a game tree")
        self.name = env.name
        self.num_players = P = env.num_seats
        self.infosets: list[str] = []
        self.actions: list[list[str]] = []
        self.player: list[int] = []
        self._index: dict[str, int] = {}
        self._depth: list[int] = []
        edges: list[tuple[int, int, int, int, int, float]] = []  # depth, parent, child, col, slot, p
        util: dict[int, list[float]] = {}
        self.n_nodes = 1
        deals = env.deal_outcomes()

        def expand(state: Any, node: int, depth: int) -> None:
            seat = state.current_seat()
            if seat is None:
                util[node] = state.returns()
                return
            legal = state.legal_actions(seat)
            iset = self._infoset(state.info_state(seat), legal, seat, depth)
            for k, a in enumerate(legal):
                child = state.clone()
                child.step(a)
                cid = self.n_nodes
                self.n_nodes += 1
                edges.append((depth, node, cid, seat, self._slot_base[iset] + k, 0.0))
                expand(child, cid, depth + 1)

        self._slot_base: list[int] = []
        self.n_slots = 0
        for deal in deals:
            state = env.clone()
            state.reset_deal(deal)
            cid = self.n_nodes
            self.n_nodes += 1
            edges.append((0, 0, cid, P, -1, 1.0 / len(deals)))
            expand(state, cid, 1)

        self.offset = np.array(self._slot_base + [self.n_slots], dtype=np.int64)
        self.slot_infoset = np.repeat(np.arange(len(self.infosets)), np.diff(self.offset))
        self.slot_local = np.arange(self.n_slots) - self.offset[self.slot_infoset]
        self.n_actions = np.diff(self.offset)
        self.utility = np.zeros((self.n_nodes, P))
        for node, u in util.items():
            self.utility[node] = u
        sums = np.array([sum(u) for u in util.values()])
        if not np.allclose(sums, sums[0]):
            raise ValueError(f"{self.name}: not a constant-sum game")
        self.utility_sum = float(sums[0])
        e = np.array(edges, dtype=np.float64)
        order = np.argsort(e[:, 0], kind="stable")
        e = e[order]
        self.levels: list[Level] = []
        for d in range(int(e[:, 0].max()) + 1):
            m = e[:, 0] == d
            slot = e[m, 4].astype(np.int64)
            self.levels.append(Level(e[m, 1].astype(np.int64), e[m, 2].astype(np.int64),
                                     e[m, 3].astype(np.int64), slot, e[m, 5], slot >= 0))

    def _infoset(self, key: str, legal: list[str], seat: int, depth: int) -> int:
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.infosets)
            self.infosets.append(key)
            self.actions.append(list(legal))
            self.player.append(seat)
            self._depth.append(depth)
            self._slot_base.append(self.n_slots)
            self.n_slots += len(legal)
        elif self.actions[i] != legal or self.player[i] != seat or self._depth[i] != depth:
            raise ValueError(f"{self.name}: information set {key!r} is inconsistent "
                             "(legal actions, seat or depth differ between its histories)")
        return i

    # --- policies ------------------------------------------------------------
    def uniform(self) -> np.ndarray:
        return 1.0 / self.n_actions[self.slot_infoset]

    def sigma_from(self, policy: Any) -> np.ndarray:
        """Query ``policy(info_state, legal) -> {action: prob}`` (or a dict of such dicts);
        a ``sigma`` vector ``[n_slots]`` is returned as it is."""
        if isinstance(policy, np.ndarray):
            if policy.shape != (self.n_slots,):
                raise ValueError(f"a sigma vector for {self.name} has shape ({self.n_slots},), "
                                 f"not {policy.shape}")
            return policy
        sigma = np.zeros(self.n_slots)
        for i, (key, legal) in enumerate(zip(self.infosets, self.actions)):
            probs = policy[key] if isinstance(policy, dict) else policy(key, list(legal))
            bad = set(probs) - set(legal)
            if bad:
                raise ValueError(f"policy gives illegal actions {sorted(bad)} at {key!r}; legal: {legal}")
            row = np.array([float(probs.get(a, 0.0)) for a in legal])
            if (row < -1e-12).any() or abs(row.sum() - 1.0) > 1e-6:
                raise ValueError(f"policy at {key!r} is not a distribution over {legal}: {probs}")
            sigma[self.offset[i]:self.offset[i + 1]] = np.clip(row, 0.0, None) / row.sum()
        return sigma

    def as_dict(self, sigma: np.ndarray) -> dict[str, dict[str, float]]:
        return {key: {a: float(sigma[self.offset[i] + k]) for k, a in enumerate(legal)}
                for i, (key, legal) in enumerate(zip(self.infosets, self.actions))}

    def own_reach(self, sigma: np.ndarray) -> np.ndarray:
        """``[n_infosets]``: the acting seat's own contribution to the reach probability of
        each information set, prod of its own action probabilities on the way there (the
        same for every history of the set, by perfect recall)."""
        r = self.reach(sigma)
        out = np.zeros(len(self.infosets))
        for lv in self.levels:
            d = lv.decision
            iset = self.slot_infoset[lv.slot[d]]
            out[iset] = r[lv.parent[d], lv.col[d]]
        return out

    def average_strategy(self, sigmas: Any, weights: Any = None) -> np.ndarray:
        """The behaviour strategy of the mixture "draw policy k with probability w_k, play it
        for the whole game" (Kuhn's theorem; the average strategy of fictitious play and
        CFR): at information set I of seat i,

            avg(a|I) = sum_k w_k pi_i^k(I) sigma_k(a|I) / sum_k w_k pi_i^k(I),

        pi_i^k(I) = `own_reach` of sigma_k. Where no policy reaches I, the plain weighted
        average. ``sigmas``: ``[K, n_slots]``; ``weights``: ``[K]`` (default uniform)."""
        sigmas = np.asarray(sigmas, dtype=np.float64)
        if sigmas.ndim != 2 or sigmas.shape[1] != self.n_slots or len(sigmas) == 0:
            raise ValueError(f"average_strategy needs [K >= 1, {self.n_slots}] policies, "
                             f"got shape {sigmas.shape}")
        w = np.full(len(sigmas), 1.0 / len(sigmas)) if weights is None \
            else np.asarray(weights, dtype=np.float64) / np.sum(weights)
        reach = np.stack([self.own_reach(s) for s in sigmas])  # [K, n_infosets]
        coef = w[:, None] * reach[:, self.slot_infoset]  # [K, n_slots]
        num, den = (coef * sigmas).sum(0), coef.sum(0)
        plain = (w[:, None] * sigmas).sum(0)
        return _ratio(num, den, plain)

    def action_values(self, sigma: np.ndarray) -> np.ndarray:
        """``[n_slots]``: the acting seat's expected utility of each action given that its
        information set is reached, everyone playing ``sigma``:

            Q(I, a) = sum_{h in I} pi_{-i}(h) v_i(h.a) / sum_{h in I} pi_{-i}(h),

        pi_{-i} the other seats' and chance's reach. Where the others never reach I, 0."""
        reach, v = self.reach(sigma), self.values(sigma)
        num, den = np.zeros(self.n_slots), np.zeros(self.n_slots)
        for lv in self.levels:
            d = lv.decision
            par, col, sl = lv.parent[d], lv.col[d], lv.slot[d]
            others = reach[par].copy()
            others[np.arange(len(par)), col] = 1.0
            others = np.prod(others, axis=1)
            num += np.bincount(sl, others * v[lv.child[d], col], minlength=self.n_slots)
            den += np.bincount(sl, others, minlength=self.n_slots)
        return _ratio(num, den, 0.0)

    # --- passes --------------------------------------------------------------
    def reach(self, sigma: np.ndarray) -> np.ndarray:
        """Reach probability of every node split by contributor: ``[n_nodes, P + 1]``
        (column P = chance); the full reach is the row product."""
        r = np.ones((self.n_nodes, self.num_players + 1))
        for lv in self.levels:
            w = np.where(lv.decision, sigma[lv.slot], lv.prob)
            cr = r[lv.parent].copy()
            cr[np.arange(len(lv.child)), lv.col] *= w
            r[lv.child] = cr
        return r

    def values(self, sigma: np.ndarray) -> np.ndarray:
        """Expected utility of every node for every seat under ``sigma``: ``[n_nodes, P]``."""
        v = self.utility.copy()
        for lv in reversed(self.levels):
            w = np.where(lv.decision, sigma[lv.slot], lv.prob)
            np.add.at(v, lv.parent, w[:, None] * v[lv.child])
        return v

    def best_response_value(self, sigma: np.ndarray, seat: int, reach: np.ndarray | None = None) -> float:
        """Value for ``seat`` of a best response to ``sigma`` of the other seats.

        Backward by depth: at the seat's information sets choose
        argmax_a sum_{h in I} pi_{-seat}(h) v(h.a); all histories of an infoset share a depth.
        """
        if reach is None:
            reach = self.reach(sigma)
        cf = np.prod(np.delete(reach, seat, axis=1), axis=1)
        v = self.utility[:, seat].copy()
        big = int(self.n_actions.max()) + 1
        for lv in reversed(self.levels):
            mine = lv.decision & (lv.col == seat)
            other = ~mine
            w = np.where(lv.decision, sigma[lv.slot], lv.prob)
            np.add.at(v, lv.parent[other], w[other] * v[lv.child[other]])
            if mine.any():
                par, ch, sl = lv.parent[mine], lv.child[mine], lv.slot[mine]
                q = np.bincount(sl, cf[par] * v[ch], minlength=self.n_slots)
                qmax = np.maximum.reduceat(q, self.offset[:-1])
                key = np.where(q >= qmax[self.slot_infoset] - 1e-12, big - self.slot_local, 0)
                best = big - np.maximum.reduceat(key, self.offset[:-1])
                take = self.slot_local[sl] == best[self.slot_infoset[sl]]
                np.add.at(v, par[take], v[ch[take]])
        return float(v[0])


@functools.lru_cache(maxsize=16)
def _tree(name: str, options: tuple) -> GameTree:
    from sparring.envs import make

    return GameTree(make(name, **dict(options)))


def game_tree(game: Any, **options: Any) -> GameTree:
    """A `GameTree` from a registered env name or alias (with options), an env instance, or
    a tree. A name must be of an env registered with ``game_tree=True``."""
    if isinstance(game, GameTree):
        return game
    if isinstance(game, str):
        from sparring.envs import env_entry

        entry = env_entry(game)
        if not entry.extra.get("game_tree"):
            raise ValueError(f"{entry.name!r} declares no game tree: exploitability and CFR "
                             "need an env registered with game_tree=True (Kuhn, Leduc)")
        return _tree(entry.name, tuple(sorted(options.items())))
    return GameTree(game)
