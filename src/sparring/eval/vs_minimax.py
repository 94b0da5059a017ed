"""The exact result of a policy against the minimax bot, and the policy's blunders.

`MinimaxBot` plays uniformly at random among its optimal actions, so even a greedy policy's
match against it is random, and `evaluate_vs_bot` estimates its rates from ``n`` games.
Here they are computed exactly, over the tree of the positions the match can reach (a
two-seat, zero-sum, deterministic game with ``clone()`` and ``state_key()``: tic-tac-toe,
Nim). With ``G(s)`` the distribution of the policy's future return from position ``s``:

    G(terminal) = delta_0
    G(s) = sum_a pi(a | s) * (r_me(s, a) + G(s·a))      at the policy's turn
    G(s) = mean over a in A*(s) of (r_me(s, a) + G(s·a))  at the bot's turn,

``A*(s)`` the bot's optimal actions; win / draw / loss = P(return > 0 / = 0 / < 0) from the
start. ``pi`` is the policy's distribution, or its argmax when ``greedy`` (the first of
equal maxima, as ``max`` takes it).

A *blunder* is an action the policy plays (``pi > 0``) that lowers the minimax value of its
seat: ``r_me(s, a) + V_me(s·a) < V_me(s)`` (a won position to a draw or a loss, a drawn one
to a loss), with ``V_me`` = `minimax_value` for seat 0 and its negation for seat 1.

*Conversion* (`conversion_vs_minimax`) is the other side of the same match: every position
within the game's first ``plies`` moves (any moves, both seats) where seat ``s`` is to move
with a forced win (``V_s > 0``: the other seat has already erred), and the policy's exact
win probability from there against minimax. Non-loss says whether a policy avoids
mistakes; conversion says whether it punishes them (a self-play opponent that never
converts a wrong answer never teaches the other seat to avoid it).

The policy is asked once per depth, for every reachable position where it is to move
(``action_probs(envs, seat)``, a batch), so a model scores the reachable positions in a few
batched forward passes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparring.envs.bots.minimax import minimax_value, optimal_children

ActionProbs = Callable[[list[Any], int], list[dict[str, float]]]


@dataclass
class Blunder:
    """The policy's action ``action`` at ``observation`` (``prob``: its probability under
    the policy, also when the greedy policy plays it always), its seat's minimax value
    going from ``value_before`` to ``value_after``."""

    seat: int
    observation: str
    action: str
    prob: float
    value_before: float
    value_after: float


@dataclass
class VsMinimax:
    """Exact rates of the policy against minimax, per seat it played and their mean."""

    win: dict[int, float]
    draw: dict[int, float]
    loss: dict[int, float]
    blunders: list[Blunder] = field(default_factory=list)

    def rates(self) -> dict[str, float]:
        """``win``, ``draw``, ``loss``, ``non_loss`` (means over the seats, each seat
        weighted alike, as `evaluate_vs_bot` rotates them) and ``non_loss_seat{s}``."""
        seats = sorted(self.win)
        out = {k: sum(getattr(self, k)[s] for s in seats) / len(seats)
               for k in ("win", "draw", "loss")}
        out["non_loss"] = out["win"] + out["draw"]
        out.update({f"non_loss_seat{s}": self.win[s] + self.draw[s] for s in seats})
        out["blunder_states"] = float(len(self.blunders))
        return out


def _seat_value(env: Any, seat: int) -> float:
    v = minimax_value(env)
    return v if seat == 0 else 0.0 - v  # 0.0 - v: no -0.0 in reports


def _against_minimax(root: Any, me: int, action_probs: ActionProbs, greedy: bool
                     ) -> tuple[dict[float, float], list[Blunder]]:
    """The distribution of seat ``me``'s return from ``root`` and the blunders on the way."""
    # Forward, one depth at a time: each reachable position once (by state_key), with its
    # outgoing edges (probability, seat ``me``'s reward, child key); none at a terminal.
    edges: dict[str, list[tuple[float, float, str]]] = {}
    blunders: list[Blunder] = []
    frontier = {root.state_key(): root}
    while frontier:
        nxt: dict[str, Any] = {}
        mine = [(k, e) for k, e in frontier.items() if e.current_seat() == me]
        for (key, env), pi in zip(mine, action_probs([e for _, e in mine], me) if mine else []):
            played = {max(pi, key=pi.get): 1.0} if greedy else pi
            before = _seat_value(env, me)
            edges[key] = []
            for a, p in played.items():
                if p <= 0.0:
                    continue
                child = env.clone()
                r = child.step(a).rewards[me]
                after = r + _seat_value(child, me)
                if after < before - 1e-9:
                    blunders.append(Blunder(me, env.observation(me), a, pi[a], before, after))
                edges[key].append((p, r, child.state_key()))
                nxt.setdefault(child.state_key(), child)
        for key, env in frontier.items():
            if env.current_seat() is None:
                edges[key] = []
            elif env.current_seat() != me:  # the bot: uniform over its optimal actions
                kids = optimal_children(env)
                sign = 1.0 if me == 0 else -1.0  # zero-sum: r_me = sign * r_0
                edges[key] = [(1.0 / len(kids), sign * r, c.state_key()) for _, r, c in kids]
                for _, _, c in kids:
                    nxt.setdefault(c.state_key(), c)
        frontier = {k: e for k, e in nxt.items() if k not in edges}

    memo: dict[str, dict[float, float]] = {}

    def returns(key: str) -> dict[float, float]:
        if not edges[key]:
            return {0.0: 1.0}
        if key not in memo:
            dist: dict[float, float] = {}
            for p, r, child in edges[key]:
                for g, q in returns(child).items():
                    v = round(r + g, 9)
                    dist[v] = dist.get(v, 0.0) + p * q
            memo[key] = dist
        return memo[key]

    return returns(root.state_key()), blunders


@dataclass
class WonPosition:
    """A position where ``seat`` is to move with a forced win, and the policy's exact
    probability of winning from it against minimax (1.0 for an optimal policy)."""

    seat: int
    observation: str
    win: float


def conversion_vs_minimax(make_env: Callable[[], Any], action_probs: ActionProbs,
                          seats: Sequence[int] = (0, 1), greedy: bool = True,
                          plies: int = 3) -> list[WonPosition]:
    """The won positions of ``seats`` within ``plies`` moves of a fresh ``make_env()`` (each
    distinct position once, in the order reached) and the policy's exact win probability
    from each against minimax; see the module docstring."""
    root = make_env()
    found: dict[str, tuple[int, Any]] = {}
    frontier = {root.state_key(): root}
    for _ in range(plies + 1):
        nxt: dict[str, Any] = {}
        for key, env in frontier.items():
            seat = env.current_seat()
            if seat is None:
                continue
            if seat in seats and _seat_value(env, seat) > 0:
                found.setdefault(key, (seat, env))
            for a in env.legal_actions(seat):
                child = env.clone()
                child.step(a)
                nxt.setdefault(child.state_key(), child)
        frontier = nxt
    asked: dict[tuple[str, int], dict[str, float]] = {}  # the roots' subtrees overlap

    def probs(envs: list[Any], seat: int) -> list[dict[str, float]]:
        new = [e for e in envs if (e.state_key(), seat) not in asked]
        for e, pi in zip(new, action_probs(new, seat) if new else []):
            asked[e.state_key(), seat] = pi
        return [asked[e.state_key(), seat] for e in envs]

    out = []
    for seat, env in found.values():
        dist, _ = _against_minimax(env, seat, probs, greedy)
        out.append(WonPosition(seat, env.observation(seat),
                               sum(q for g, q in dist.items() if g > 0)))
    return out


def exact_vs_minimax(make_env: Callable[[], Any], action_probs: ActionProbs,
                     seats: Sequence[int] = (0, 1), greedy: bool = True) -> VsMinimax:
    """The policy (``action_probs(envs, seat) -> [{action: probability}]``) against the
    minimax bot from a fresh ``make_env()``, in each of ``seats``; see the module docstring."""
    win, draw, loss, blunders = {}, {}, {}, []
    for me in seats:
        env = make_env()
        if getattr(env, "num_seats", None) != 2 or not hasattr(env, "clone") \
                or not hasattr(env, "state_key"):
            raise TypeError(f"exact play against minimax needs a two-seat env with clone() and "
                            f"state_key(); got {type(env).__name__}")
        dist, found = _against_minimax(env, me, action_probs, greedy)
        win[me] = sum(q for g, q in dist.items() if g > 0)
        loss[me] = sum(q for g, q in dist.items() if g < 0)
        draw[me] = 1.0 - win[me] - loss[me]
        blunders += found
    return VsMinimax(win, draw, loss, blunders)
