"""Reference bots against each other: how strong a bot is, in non-loss with its interval.

For tic-tac-toe, plays each pair (the `tactical` bot against `random` and `minimax`,
`random` against `minimax` as the floor) over ``--games`` seeds in both seatings
(`sparring.eval.play_match`) and prints the first bot's non-loss (wins + draws) with its
Wilson 95% interval. Against minimax non-loss 1.0 is optimal play.

    PYTHONPATH=src python bench/bots.py              # 200 seeds x 2 seatings = 400 games
    PYTHONPATH=src python bench/bots.py --games 20   # smoke test
"""

from __future__ import annotations

import argparse

from sparring.envs.bots import make_bot
from sparring.eval import play_match, wilson

PAIRS = [("tactical", "random"), ("tactical", "minimax"), ("random", "minimax")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--games", type=int, default=200, help="seeds per pair (x 2 seatings)")
    ap.add_argument("--game", default="tictactoe")
    args = ap.parse_args()
    print(f"{args.game}: non-loss of the first bot, {2 * args.games} games per pair")
    for i, (a, b) in enumerate(PAIRS):
        res = play_match(args.game, {a: make_bot(a, 2 * i), b: make_bot(b, 2 * i + 1)},
                         games=args.games)
        r = res.overall[a]
        lo, hi = wilson(r.wins + r.draws, r.games)
        print(f"  {a:9s} vs {b:8s} {(r.wins + r.draws) / r.games:.3f} [{lo:.3f}, {hi:.3f}]"
              f"  (win {r.wins / r.games:.3f}, loss {r.losses / r.games:.3f})")


if __name__ == "__main__":
    main()
