"""UCT Monte-Carlo tree search with uniformly random rollouts (Kocsis & Szepesvari, 2006).

Each simulation: select children by UCB1 for the seat to move,
  argmax_a  W_seat(a) / N(a) + c * sqrt(ln N(parent) / N(a)),
expand one untried action, roll out uniformly at random to the end, back up the final
returns of every seat. The move played is the most visited child (ties broken at random).
Works for any env with ``clone()`` and finite legal actions, any number of seats.
"""

from __future__ import annotations

import math
from typing import Any

from sparring.envs.bots.simple import Bot


class _Node:
    __slots__ = ("children", "n", "untried", "w")

    def __init__(self, untried: list[str], seats: int) -> None:
        self.children: dict[str, _Node] = {}
        self.untried = untried
        self.n = 0
        self.w = [0.0] * seats


class MCTSBot(Bot):
    """UCT with ``simulations`` playouts per move and exploration constant ``c``."""

    def __init__(self, simulations: int = 200, c: float = 1.4, seed: int = 0) -> None:
        super().__init__(seed)
        if simulations < 1:
            raise ValueError(f"MCTSBot: simulations must be >= 1, got {simulations}")
        if c < 0:
            raise ValueError(f"MCTSBot: c must be >= 0, got {c}")
        self.simulations = simulations
        self.c = c

    def act(self, env: Any, seat: int) -> str:
        legal = self._legal(env, seat)
        if len(legal) == 1:
            return legal[0]
        rng = self.rng
        k = env.num_seats
        root = _Node(list(legal), k)
        rng.shuffle(root.untried)
        for _ in range(self.simulations):
            state = env.clone()
            node, path = root, [root]
            # selection
            while not node.untried and node.children:
                s = state.current_seat()
                log_n = math.log(node.n)
                a, node = max(node.children.items(),
                              key=lambda kv: kv[1].w[s] / kv[1].n + self.c * math.sqrt(log_n / kv[1].n))
                state.step(a)
                path.append(node)
            # expansion
            if node.untried:
                a = node.untried.pop()
                state.step(a)
                s = state.current_seat()
                untried = [] if s is None else list(state.legal_actions(s))
                rng.shuffle(untried)
                child = _Node(untried, k)
                node.children[a] = child
                node = child
                path.append(node)
            # rollout
            s = state.current_seat()
            while s is not None:
                state.step(rng.choice(state.legal_actions(s)))
                s = state.current_seat()
            ret = state.returns()
            for nd in path:
                nd.n += 1
                w = nd.w
                for i in range(k):
                    w[i] += ret[i]
        most = max(ch.n for ch in root.children.values())
        return rng.choice([a for a, ch in root.children.items() if ch.n == most])
