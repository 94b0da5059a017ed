"""The exploitability floor an entropy bonus sets: for each weight alpha, the exploitability
of the game's agent logit equilibrium (`sparring.eval.logit_equilibrium`), the point that
self-play with a constant bonus alpha per decision is pulled towards.

    PYTHONPATH=src python bench/entropy_floor.py leduc --alphas 1,0.5,0.3,0.2,0.1

Solved from the largest alpha down, each from the previous solution.
"""

from __future__ import annotations

import argparse
import time

from sparring.eval import exploitability, game_tree
from sparring.eval.logit_equilibrium import logit_equilibrium


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("game", help="a game with a tree: kuhn_poker, leduc")
    ap.add_argument("--alphas", default="1,0.5,0.3,0.2,0.1,0.05")
    ap.add_argument("--max-iterations", type=int, default=200_000)
    args = ap.parse_args()
    tree = game_tree(args.game)
    alphas = sorted((float(a) for a in args.alphas.split(",")), reverse=True)
    print(f"{args.game}: uniform play {exploitability(tree, tree.uniform()):.4f}")
    print("| alpha | exploitability of the logit equilibrium | residual | iterations | s |")
    print("|---|---|---|---|---|")
    start = None
    for alpha in alphas:
        t0 = time.perf_counter()
        eq = logit_equilibrium(tree, alpha, start=start, max_iterations=args.max_iterations)
        start = eq.sigma
        note = "" if eq.converged else " (not converged)"
        print(f"| {alpha:g} | {exploitability(tree, eq.sigma):.4f}{note} | {eq.residual:.1e} "
              f"| {eq.iterations} | {time.perf_counter() - t0:.0f} |", flush=True)


if __name__ == "__main__":
    main()
