"""Exact minimax for two-seat zero-sum perfect-information games (tic-tac-toe, Nim).

V(s) = future reward of seat 0 from state s under optimal play:
V(terminal) = 0;  V(s) = max_a / min_a [r_0(s, a) + V(s')] as seat 0 / seat 1 moves.
Values are memoised per game name and state_key(), so each state is solved once per process
(tic-tac-toe: 5,478 states). The bot picks uniformly among the optimal actions.
A game whose tree is too large to solve (Connect Four) stops with a `ValueError` naming it
after ``MAX_STATES`` solved states, rather than running for hours.
"""

from __future__ import annotations

from typing import Any

from sparring.envs.bots.simple import Bot

_CACHE: dict[str, dict[str, float]] = {}  # game name -> {state_key: value}
MAX_STATES = 200_000  # per game name; tic-tac-toe has 5,478


def _children(env: Any) -> list[tuple[str, float, Any]]:
    out = []
    seat = env.current_seat()
    for a in env.legal_actions(seat):
        child = env.clone()
        r = child.step(a).rewards[0]
        out.append((a, r, child))
    return out


def minimax_value(env: Any) -> float:
    """Optimal future reward of seat 0 from the env's current state (memoised)."""
    if getattr(env, "num_seats", 2) != 2 or not hasattr(env, "clone"):
        raise TypeError(f"minimax needs a two-seat env with clone(); got {type(env).__name__}")
    solved, key = _CACHE.setdefault(env.name, {}), env.state_key()
    v = solved.get(key)
    if v is not None:
        return v
    if len(solved) >= MAX_STATES:
        raise ValueError(f"exact minimax gave up on {env.name!r} after solving {MAX_STATES:,} "
                         "states: its game tree is too large to solve exactly; evaluate "
                         "against the 'mcts' bot instead")
    seat = env.current_seat()
    if seat is None:
        v = 0.0
    else:
        vals = [r + minimax_value(c) for _, r, c in _children(env)]
        v = max(vals) if seat == 0 else min(vals)
    solved[key] = v
    return v


def forget(env: Any) -> None:
    """Drop the values solved for ``env``'s game (after a game too large to solve)."""
    _CACHE.pop(getattr(env, "name", None), None)


def optimal_children(env: Any) -> list[tuple[str, float, Any]]:
    """(action, reward of seat 0, child) of each optimal action of the seat to move: those
    whose ``r_0 + V(child)`` is the mover's best (max for seat 0, min for seat 1)."""
    sign = 1.0 if env.current_seat() == 0 else -1.0
    scored = [(sign * (r + minimax_value(c)), a, r, c) for a, r, c in _children(env)]
    best = max(v for v, _, _, _ in scored)
    return [(a, r, c) for v, a, r, c in scored if v >= best - 1e-9]


class MinimaxBot(Bot):
    """Optimal play with uniform random tie-breaking among optimal actions."""

    def act(self, env: Any, seat: int) -> str:
        self._legal(env, seat)
        return self.rng.choice([a for a, _, _ in optimal_children(env)])
