"""Does a tic-tac-toe policy block a three, and complete its own? Every such position,
scored exactly.

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
A must-win position: reachable, the mover has a win in one (``wins``: how often the most
probable cell completes a three; ``mean p(win)``: the probability of all such cells). A
policy that misses its own wins cannot punish a missed block in self-play, so the two
rates read together say where a tactic is missing. ``by line`` splits each kind (both
seats) by the direction of the line the good move completes, as the model reads the
board (rows, columns or diagonals of the shown view; ``several``: more than one): a
model that can read rows but not columns of a text grid shows it there.
``--uniform GAMES``: how often that many uniformly random games (the run's game options)
pass each kind of position, by direction: whether a direction is rare in play.
``--own GAMES``: the same count for GAMES games of the policy against itself, each move
sampled from its distribution over the legal cells (as constrained decoding samples in
training), with the mean probability it gives the good move there: whether the policy's
own self-play ever puts it where a tactic is missing.
``--misses``: every position the greedy move fails, as the mover sees it, with the move
taken and the probability of the good one, by how many marks are on the board.
``base:RUN`` builds the run's model without any training (its config, no checkpoint).
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections import Counter
from pathlib import Path

from sparring.envs import make
from sparring.envs.games.tictactoe import LINES, MARKS, VIEWS, tactic_at

DIRECTIONS = ("row",) * 3 + ("column",) * 3 + ("diagonal",) * 2  # of LINES, in order


def must_block_positions() -> list[tuple[list[str], int, int]]:
    """(board, seat to move, the one blocking cell) for every reachable must-block board."""
    return [(b, seat, next(iter(cells))) for b, seat, kind, cells in tactic_positions()
            if kind == "block"]


def must_win_positions() -> list[tuple[list[str], int, set[int]]]:
    """(board, seat to move, its winning cells) for every reachable board with a win in one."""
    return [(b, seat, cells) for b, seat, kind, cells in tactic_positions() if kind == "win"]


def tactic_positions() -> list[tuple[list[str], int, str, set[int]]]:
    """(board, seat to move, 'win' or 'block', the cells that do it) for every reachable
    unfinished board where the mover has a win in one ('win'), or has none and the other
    seat has exactly one ('block')."""
    seen: set[str] = set()
    found: list[tuple[list[str], int, str, set[int]]] = []

    def walk(board: list[str], seat: int) -> None:
        if "".join(board) in seen:
            return
        seen.add("".join(board))
        if "." not in board or any(board[a] != "." and board[a] == board[b] == board[c]
                                   for a, b, c in LINES):
            return
        tactic = tactic_at(board, seat)
        if tactic is not None:
            found.append((list(board), seat, *tactic))
        for cell in range(9):
            if board[cell] == ".":
                walk(board[:cell] + [MARKS[seat]] + board[cell + 1:], 1 - seat)

    walk(["."] * 9, 0)
    return found


def uniform_visits(options: dict, games: int, seed: int = 0) -> Counter[tuple[str, str]]:
    """How often ``games`` uniformly random games (env ``options``) pass a must-win or
    must-block position, by (kind, direction of its line in the mover's shown view)."""
    rng, visits = random.Random(seed), Counter()
    for g in range(games):
        env = make("tictactoe", **options)
        env.reset(g)
        game = getattr(env, "env", env)
        while not game.done:
            seat = game.turn
            seen = tactic_seen(env, seat)
            if seen is not None:
                visits[seen[:2]] += 1
            game.step(rng.choice(game.legal_actions(seat)))
    return visits


def tactic_seen(env, seat: int) -> tuple[str, str, set[str]] | None:
    """The tactic ``seat`` faces in ``env`` (a tic-tac-toe game, maybe under a view
    wrapper) as it is shown: (kind, direction of its line in the shown view, the good
    moves as the view names them), or None (`tactic_at`)."""
    game = getattr(env, "env", env)  # the board under a view wrapper
    tactic = tactic_at(game.board, seat)
    if tactic is None:
        return None
    kind, cells = tactic
    view = env.view(seat) if hasattr(env, "view") else 0
    mark = MARKS[seat] if kind == "win" else MARKS[1 - seat]
    return (kind, line_direction(game.board, view, cells, mark),
            {game.view_action(str(c + 1), view) for c in cells})


def own_visits(policy, arena, options: dict, games: int, seed: int = 0
               ) -> dict[tuple[str, str], list[float]]:
    """``games`` games of ``policy`` against itself (env ``options``), every move sampled
    from `probabilities_at` (the policy's distribution over the legal cells), all games a
    ply at a time: ``{(kind, direction): probabilities of the good move where met}``."""
    from sparring.eval.games import probabilities_at

    rng, met = random.Random(seed), {}
    envs = [make("tictactoe", **options) for _ in range(games)]
    for g, env in enumerate(envs):
        env.reset(g)
    while live := [e for e in envs if not getattr(e, "env", e).done]:
        positions = [(e, getattr(e, "env", e).turn) for e in live]
        for (env, seat), probs in zip(positions, probabilities_at(policy, arena, positions)):
            seen = tactic_seen(env, seat)
            if seen is not None:
                kind, direction, good = seen
                met.setdefault((kind, direction), []).append(sum(probs[a] for a in good))
            moves = list(probs)
            env.step(rng.choices(moves, weights=[probs[a] for a in moves])[0])
    return met


def line_direction(board: list[str], view: int, cells: set[int], mark: str) -> str:
    """The direction, in view ``view`` of ``board``, of the lines of two ``mark`` that
    ``cells`` (board indices) complete: 'row', 'column', 'diagonal', or 'several' when
    they are not all one direction."""
    shown = [board[VIEWS[view][v]] for v in range(9)]
    at = {VIEWS[view].index(c) for c in cells}
    found = {DIRECTIONS[k] for k, line in enumerate(LINES)
             if at & set(line) and sum(shown[i] == mark for i in line) == 2}
    return found.pop() if len(found) == 1 else "several"


def load(spec: str, device: str | None = None):
    """(policy, config, label) of ``RUN`` (its last checkpoint) or ``base:RUN``; ``device``:
    where it runs (default: the run's)."""
    from sparring.assembly.trained import load_policies
    from sparring.config.run_folder import read_run_config

    if spec.startswith("base:"):
        from sparring.assembly.parts import load_model
        from sparring.policy.hf import HFPolicy

        cfg = read_run_config(Path(spec[5:]) / "config.yaml")
        return (HFPolicy(*load_model(cfg), device=device or cfg.model.device, name="base"),
                cfg, f"{spec[5:]} untrained")
    policies, cfg, ckpt = load_policies(spec, device)
    return next(iter(policies.values())), cfg, str(ckpt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run folders, or base:RUN for the untrained model")
    ap.add_argument("--uniform", type=int, default=0, metavar="GAMES",
                    help="also count the tactics GAMES uniformly random games meet, by line")
    ap.add_argument("--own", type=int, default=0, metavar="GAMES",
                    help="also count the tactics GAMES games of the policy against itself "
                         "meet, by line, with its mean probability of the good move there")
    ap.add_argument("--misses", action="store_true",
                    help="also print every position whose greedy move fails the tactic")
    ap.add_argument("--device", help="where the model runs (default: the run's model.device)")
    args = ap.parse_args()
    from sparring.eval.games import probabilities_at
    from sparring.eval.periodic import env_options
    from sparring.rollout.rollouts import make_arena

    for spec in args.runs:
        policy, cfg, label = load(spec, args.device)
        options = env_options(cfg, "tictactoe")
        if args.uniform:
            visits = uniform_visits(options, args.uniform)
            print(f"{label}  {args.uniform} uniformly random games meet: " + ", ".join(
                f"must-{k} by {d} {n}" for (k, d), n in sorted(visits.items())))
        if args.own:
            met = own_visits(policy, make_arena(cfg.rollout), options, args.own)
            print(f"{label}  {args.own} games against itself meet: " + ", ".join(
                f"must-{k} by {d} {len(p)} (mean p(good) {statistics.mean(p):.2f})"
                for (k, d), p in sorted(met.items())))
        positions, kinds, goods, lines, texts = [], [], [], [], set()
        for board, seat, kind, _ in tactic_positions():
            env = make("tictactoe", **options)
            game = getattr(env, "env", env)  # the board under a view wrapper
            game.board, game.turn = board, seat
            text = env.observation(seat)
            if text in texts:
                continue
            texts.add(text)
            _, direction, good = tactic_seen(env, seat)
            positions.append((env, seat))
            kinds.append(kind)
            goods.append(good)
            lines.append(direction)
        probs = probabilities_at(policy, make_arena(cfg.rollout), positions)
        top = [max(p, key=p.get) for p in probs]  # each position's greedy move
        for kind in ("block", "win"):
            for seat in (0, 1):
                idx = [i for i, (_, s) in enumerate(positions)
                       if s == seat and kinds[i] == kind]
                good_p = [sum(probs[i][a] for a in goods[i]) for i in idx]
                uniform = [len(goods[i]) / len(probs[i]) for i in idx]
                print(f"{label}  {MARKS[seat]} must-{kind}: {len(idx)} positions, "
                      f"greedy {kind}s {sum(top[i] in goods[i] for i in idx) / len(idx):.2f}, "
                      f"mean p({kind}) {statistics.mean(good_p):.2f} "
                      f"(uniform {statistics.mean(uniform):.2f}), greedy = first free "
                      f"{sum(top[i] == min(probs[i], key=int) for i in idx) / len(idx):.2f}")
            parts = []
            for d in (*dict.fromkeys(DIRECTIONS), "several"):
                idx = [i for i in range(len(positions)) if kinds[i] == kind and lines[i] == d]
                if idx:
                    hit = sum(top[i] in goods[i] for i in idx)
                    parts.append(f"{d} {hit / len(idx):.2f} ({len(idx)})")
            print(f"{label}  must-{kind} by line (greedy): {', '.join(parts)}")
        if args.misses:
            print_misses(label, positions, kinds, goods, lines, probs)


def print_misses(label: str, positions, kinds, goods, lines, probs) -> None:
    """Each position whose greedy move (the most probable of ``probs``) fails its tactic,
    by kind and seat, fewest marks first: the board as the mover sees it (its rows of
    text), the move taken, the good moves and their probability, the line's direction."""
    top = [max(p, key=p.get) for p in probs]
    missed = [i for i in range(len(positions)) if top[i] not in goods[i]]
    missed.sort(key=lambda i: (kinds[i], positions[i][1], _marks(positions[i])))
    for i in missed:
        env, seat = positions[i]
        board = env.observation(seat).split("\n")[:3]
        p_good = sum(probs[i][a] for a in goods[i])
        print(f"{label}  missed {MARKS[seat]} must-{kinds[i]} ({_marks(positions[i])} "
              f"marks, {lines[i]}): {' / '.join(board)} -> {top[i]} at p "
              f"{probs[i][top[i]]:.2f}; {'/'.join(sorted(goods[i]))} at p {p_good:.2f}")


def _marks(position) -> int:
    """How many marks are on a position's board (under any view wrapper)."""
    env, _ = position
    return 9 - getattr(env, "env", env).board.count(".")


if __name__ == "__main__":
    main()
