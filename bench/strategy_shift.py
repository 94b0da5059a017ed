"""Where a policy's strategy moved between two checkpoints of a run on a game with a tree
(Kuhn, Leduc): each checkpoint's exploitability, the information states whose distribution
over the legal moves moved most (total variation), and, for one move, the states that
crossed from rarely playing it (p < 0.5) to nearly always (p >= 0.9) and back.

    PYTHONPATH=src python bench/strategy_shift.py CKPT_A CKPT_B --move fold \\
        --states '^[JQK]\\|[JQK]\\|.*/.*r$'    # Leduc: second round, facing a raise

Both strategies come from `sparring.eval.games.policy_strategy` (the exact evaluations'
distributions); ``--states`` is a regular expression over the information-state keys
that `sparring eval --strategy` prints.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

from sparring.assembly.trained import load_policy
from sparring.eval.exploitability import exploitability
from sparring.eval.games import policy_strategy
from sparring.rollout.rollouts import make_arena

Strategy = dict[str, dict[str, float]]


def total_variation(p: dict[str, float], q: dict[str, float]) -> float:
    """TV(p, q) = 1/2 sum_a |p(a) - q(a)| over the moves of either."""
    return 0.5 * sum(abs(p.get(a, 0.0) - q.get(a, 0.0)) for a in set(p) | set(q))


def shifts(a: Strategy, b: Strategy) -> list[tuple[float, str]]:
    """(TV, state) for the states of both strategies, largest first."""
    return sorted(((total_variation(a[k], b[k]), k) for k in a if k in b), reverse=True)


def crossings(a: Strategy, b: Strategy, move: str, states: str = ""
              ) -> tuple[list[str], list[str], list[str]]:
    """(the states matching ``states``, those whose p(``move``) went from below 0.5 in
    ``a`` to 0.9 or more in ``b``, and those that went the other way)."""
    pattern = re.compile(states)
    keys = [k for k in a if k in b and move in a[k] and pattern.search(k)]
    up = [k for k in keys if a[k][move] < 0.5 and b[k][move] >= 0.9]
    down = [k for k in keys if a[k][move] >= 0.9 and b[k][move] < 0.5]
    return keys, up, down


def strategy(checkpoint: str) -> tuple[Strategy, float]:
    """The checkpoint's strategy and exploitability, as the run's evaluation computes them."""
    policy, cfg, _ = load_policy(checkpoint, "cpu")
    arena, env = make_arena(cfg.rollout), cfg.envs[0]
    table = policy_strategy(arena, policy, env.name, env.options)
    return table, exploitability(env.name, lambda info, acts: table[info], **env.options)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--top", type=int, default=10, help="states to list by total variation")
    ap.add_argument("--move", help="count the states that crossed for this move")
    ap.add_argument("--states", default="", help="regular expression over the state keys")
    args = ap.parse_args()
    (a, ea), (b, eb) = strategy(args.before), strategy(args.after)
    print(f"exploitability {ea:.4f} -> {eb:.4f}; {len(a)} information states")
    for tv, k in shifts(a, b)[:args.top]:
        print(f"  TV {tv:.2f}  {k}: " + " ".join(f"{m} {p:.2f}" for m, p in a[k].items())
              + "  ->  " + " ".join(f"{m} {p:.2f}" for m, p in b[k].items()))
    if args.move:
        keys, up, down = crossings(a, b, args.move, args.states)
        by_prefix = Counter(k.rsplit("|", 1)[0] for k in up)
        print(f"{len(keys)} states with '{args.move}' matching {args.states!r}: {len(up)} went "
              f"from p < 0.5 to p >= 0.9 ({dict(by_prefix.most_common())}), {len(down)} the "
              "other way")


if __name__ == "__main__":
    main()
