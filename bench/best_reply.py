"""Does an exploring opponent hide the right answer? O's best replies against an eps-minimax X.

    PYTHONPATH=src python bench/best_reply.py              # eps 0.5, 0.25, 0.1
    PYTHONPATH=src python bench/best_reply.py --eps 0.5

X plays a uniformly random legal move with probability eps and otherwise a move drawn
uniformly among its minimax-optimal ones; O answers by expectimax against that X (the best
response, win +1, draw 0, loss -1). Prints, for X's corner, edge and centre openings, O's
expected return after each reply, marking the replies that keep the draw under minimax.
If the minimax-sound replies also score best, exploration in the opponent does not make
the wrong answer pay.
"""

from __future__ import annotations

import argparse
from functools import cache

from sparring.envs import make
from sparring.envs.bots.minimax import minimax_value, optimal_children


def o_values(eps: float, opening: str) -> dict[str, tuple[float, bool]]:
    """O's reply -> (expected return against the eps-minimax X, sound under minimax)."""
    envs = {}

    def key(env):
        envs.setdefault(env.state_key(), env)
        return env.state_key()

    def after(env, a):
        child = env.clone()
        child.step(a)
        return child

    @cache
    def value(k: str) -> float:  # O's expected return from state k, O best-responding
        env = envs[k]
        seat = env.current_seat()
        if seat is None:
            return env.returns()[1]
        children = [after(env, a) for a in env.legal_actions(seat)]
        if seat == 1:
            return max(value(key(c)) for c in children)
        best = [c for _, _, c in optimal_children(env)]
        return (eps * sum(value(key(c)) for c in children) / len(children)
                + (1 - eps) * sum(value(key(c)) for c in best) / len(best))

    start = after(make("tictactoe"), opening)
    return {b: (value(key(after(start, b))), minimax_value(after(start, b)) <= 0)
            for b in start.legal_actions(1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eps", type=float, nargs="*", default=[0.5, 0.25, 0.1])
    args = ap.parse_args()
    for eps in args.eps:
        for opening, what in (("1", "corner"), ("2", "edge"), ("5", "centre")):
            vals = o_values(eps, opening)
            row = "  ".join(f"{b}:{v:+.2f}{'*' if ok else ''}" for b, (v, ok) in vals.items())
            print(f"eps {eps}, X opens {opening} ({what}): O's reply -> return "
                  f"(* keeps the draw)  {row}")


if __name__ == "__main__":
    main()
