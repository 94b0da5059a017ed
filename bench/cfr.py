"""CFR / CFR+ convergence: iterations and seconds to reach a target exploitability.

For Kuhn (2 and 3 players) and Leduc, runs our vectorised solver and prints, at each
checkpoint, the iteration, solver seconds (exploitability evaluation excluded) and the
exact exploitability; then the first iteration that reached the target (Kuhn 0.01,
Leduc 0.1). With ``--openspiel`` it also runs OpenSpiel's Python CFR+ on the same game
to the same target and prints the time ratio (same machine, same run).

    PYTHONPATH=src python bench/cfr.py                # ours, all games
    PYTHONPATH=src python bench/cfr.py --openspiel    # plus OpenSpiel's CFR+ (slow on Leduc)
    PYTHONPATH=src python bench/cfr.py --quick        # smoke test
"""

from __future__ import annotations

import argparse
import time

from sparring.envs.bots.cfr import solve
from sparring.eval import exploitability, game_tree

GAMES = [("kuhn_poker", {}, "kuhn_poker", 0.01), ("kuhn_poker", {"players": 3}, "kuhn_poker", 0.01),
         ("leduc", {}, "leduc_poker", 0.1)]


def ours(name: str, opts: dict, target: float, iters: int, variant: str) -> tuple[int | None, float]:
    tree = game_tree(name, **opts)
    state = {"eval": 0.0, "hit": None, "hit_time": 0.0}
    t0 = time.perf_counter()
    checkpoints = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000}

    def cb(t, sigma):
        e0 = time.perf_counter()
        e = exploitability(tree, tree.as_dict(sigma))
        state["eval"] += time.perf_counter() - e0
        solver_s = time.perf_counter() - t0 - state["eval"]
        if state["hit"] is None and e < target:
            state["hit"], state["hit_time"] = t, solver_s
        if t in checkpoints or t == iters:
            print(f"  {variant:5s} iter {t:5d}  solver {solver_s:7.3f} s  exploitability {e:.6f}")

    solve(tree, iters, variant, callback=cb)
    return state["hit"], state["hit_time"]


def openspiel(theirs: str, opts: dict, target: float, max_iters: int) -> tuple[int | None, float]:
    import pyspiel
    from open_spiel.python.algorithms import cfr
    from open_spiel.python.algorithms import exploitability as os_expl

    game = pyspiel.load_game(theirs, opts)
    solver = cfr.CFRPlusSolver(game)
    spent = 0.0
    for t in range(1, max_iters + 1):
        t0 = time.perf_counter()
        solver.evaluate_and_update_policy()
        spent += time.perf_counter() - t0
        e = os_expl.nash_conv(game, solver.average_policy()) / game.num_players()
        if e < target:
            return t, spent
    return None, spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--quick", action="store_true", help="50 iterations, Kuhn and Leduc")
    ap.add_argument("--openspiel", action="store_true", help="also time OpenSpiel's Python CFR+")
    args = ap.parse_args()
    iters = 50 if args.quick else args.iterations
    for name, opts, theirs, target in GAMES:
        label = f"{name}{opts or ''}"
        print(f"{label}: target exploitability < {target}")
        for variant in ("cfr+", "cfr"):
            hit, secs = ours(name, opts, target, iters, variant)
            print(f"  {variant}: " + (f"reached at iteration {hit} after {secs:.3f} s" if hit
                                      else f"not reached in {iters} iterations"))
            if variant == "cfr+" and args.openspiel:
                oh, osecs = openspiel(theirs, opts, target, max_iters=200)
                if oh and hit:
                    print(f"  OpenSpiel Python CFR+: iteration {oh} after {osecs:.2f} s "
                          f"(ratio OpenSpiel/ours = {osecs / max(secs, 1e-9):.0f}x)")
                else:
                    print(f"  OpenSpiel Python CFR+: not reached in 200 iterations ({osecs:.1f} s)")


if __name__ == "__main__":
    main()
