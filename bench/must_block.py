"""Does a tic-tac-toe policy block a three? Every must-block position, scored exactly.

    PYTHONPATH=src python bench/must_block.py RUN [RUN ...]       # each run's last checkpoint
    PYTHONPATH=src python bench/must_block.py base:RUN            # the untrained model

A must-block position: reachable from the empty board, the mover has no win in one and
the opponent has exactly one (so exactly one move does not lose at once). Positions that
read the same (the run's game options, e.g. ``canonical``) count once. For each seat it
prints how many there are and, from the policy's constrained-decoding distribution over
the legal cells (prompt: the position's observation, as the exact evaluations use):
- ``greedy blocks``: how often the most probable cell is the block;
- ``mean p(block)``: the mean probability of the block (``uniform``: a random mover's);
- ``greedy = first free``: how often the most probable cell is the lowest-numbered free
  cell (a prior of the untrained model, which answers it everywhere).
``base:RUN`` builds the run's model without any training (its config, no checkpoint).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from sparring.envs import make
from sparring.envs.games.tictactoe import LINES, MARKS


def winning_cells(board: list[str], mark: str) -> set[int]:
    """The empty cells that complete a line of ``mark``."""
    return {c for line in LINES for c in line
            if board[c] == "." and sum(board[i] == mark for i in line) == 2}


def must_block_positions() -> list[tuple[list[str], int, int]]:
    """(board, seat to move, the one blocking cell) for every reachable must-block board."""
    seen: set[str] = set()
    found: list[tuple[list[str], int, int]] = []

    def walk(board: list[str], seat: int) -> None:
        if "".join(board) in seen:
            return
        seen.add("".join(board))
        if "." not in board or any(board[a] != "." and board[a] == board[b] == board[c]
                                   for a, b, c in LINES):
            return
        me, other = MARKS[seat], MARKS[1 - seat]
        threats = winning_cells(board, other)
        if not winning_cells(board, me) and len(threats) == 1:
            found.append((list(board), seat, next(iter(threats))))
        for cell in range(9):
            if board[cell] == ".":
                walk(board[:cell] + [me] + board[cell + 1:], 1 - seat)

    walk(["."] * 9, 0)
    return found


def load(spec: str):
    """(policy, config, label) of ``RUN`` (its last checkpoint) or ``base:RUN``."""
    from sparring.train.restore import load_policies, read_run_config

    if spec.startswith("base:"):
        from sparring.policy.hf import HFPolicy
        from sparring.train.parts import load_model

        cfg = read_run_config(Path(spec[5:]) / "config.yaml")
        return HFPolicy(*load_model(cfg), name="base"), cfg, f"{spec[5:]} untrained"
    policies, cfg, ckpt = load_policies(spec)
    return next(iter(policies.values())), cfg, str(ckpt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run folders, or base:RUN for the untrained model")
    args = ap.parse_args()
    from sparring.eval.games import probabilities_at
    from sparring.eval.periodic import env_options
    from sparring.rollout.schedule import make_arena

    for spec in args.runs:
        policy, cfg, label = load(spec)
        options = env_options(cfg, "tictactoe")
        positions, blocks, texts = [], [], set()
        for board, seat, cell in must_block_positions():
            env = make("tictactoe", **options)
            game = getattr(env, "env", env)  # the board under a view wrapper
            game.board, game.turn = board, seat
            text = env.observation(seat)
            if text in texts:
                continue
            texts.add(text)
            view = env.view(seat) if hasattr(env, "view") else 0
            positions.append((env, seat))
            blocks.append(game.view_action(str(cell + 1), view))
        probs = probabilities_at(policy, make_arena(cfg.rollout), positions)
        for seat in (0, 1):
            idx = [i for i, (_, s) in enumerate(positions) if s == seat]
            top = {i: max(probs[i], key=probs[i].get) for i in idx}
            print(f"{label}  {MARKS[seat]}: {len(idx)} positions, "
                  f"greedy blocks {sum(top[i] == blocks[i] for i in idx) / len(idx):.2f}, "
                  f"mean p(block) {statistics.mean(probs[i][blocks[i]] for i in idx):.2f} "
                  f"(uniform {statistics.mean(1 / len(probs[i]) for i in idx):.2f}), "
                  f"greedy = first free "
                  f"{sum(top[i] == min(probs[i], key=int) for i in idx) / len(idx):.2f}")


if __name__ == "__main__":
    main()
