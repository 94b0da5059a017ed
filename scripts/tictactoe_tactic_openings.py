"""Write the tic-tac-toe tactic openings: one move sequence per distinct position (as the
canonical view shows it to the mover) in which the mover has a win in one move, or must
block the opponent's one threat, reached by legal play without either side having won.

    PYTHONPATH=src python scripts/tictactoe_tactic_openings.py \
        > configs/openings/tictactoe_canonical_tactics.txt

The moves are the canonical view's cell names at each position (what
``make("tictactoe", canonical=True)`` accepts), so the list is for the `canonical` option
(the SmolLM2 recipe's). Used by the ``openings`` start of ``envs[].starts``
(`sparring.envs.openings`): a curriculum in which the positions that teach a tactic come up
as often as the share says, not as often as self-play happens to reach them.
"""

from __future__ import annotations

from sparring.envs import make
from sparring.envs.games.tictactoe import tactic_at


def tactic_openings() -> list[tuple[str, tuple[str, ...]]]:
    """``(kind, moves)`` for each distinct (mover, canonical observation) with a tactic, the
    first line of play reaching it in a depth-first walk (moves in the view's names)."""
    seen: set[str] = set()
    found: list[tuple[str, tuple[str, ...]]] = []

    def walk(env, moves: tuple[str, ...]) -> None:
        seat = env.current_seat()
        obs = env.observation(seat)
        if obs in seen:
            return
        seen.add(obs)
        tactic = tactic_at(env.env.board, seat)
        if tactic is not None and moves:
            found.append((tactic[0], moves))
        for a in env.legal_actions(seat):
            child = env.clone()
            if not child.step(a).done:
                walk(child, moves + (a,))

    env = make("tictactoe", canonical=True)
    env.reset(0)
    walk(env, ())
    return found


def main() -> None:
    found = tactic_openings()
    wins = sum(k == "win" for k, _ in found)
    print(f"# tic-tac-toe (canonical view): {len(found)} positions with a tactic for the "
          f"mover, {wins} win-in-one, {len(found) - wins} must-block; "
          "scripts/tictactoe_tactic_openings.py")
    for kind, moves in found:
        print(f"{' '.join(moves)}  # {kind}")


if __name__ == "__main__":
    main()
