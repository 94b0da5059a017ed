"""``sparring eval``'s report: a trained policy against bots, as one table.

For every game and policy of the run (each in its own seats when a run trains several): the
win, draw, loss and non-loss rates against each bot with Wilson 95% intervals, forfeits and
invalid answers; against minimax also the exact rates (`sparring.eval.vs_minimax`), the
positions where the policy plays a losing move (positions it sees alike printed once,
counted) and how it converts the won positions of its first three moves; for a game with a
tree (Kuhn, Leduc) the exploitability of its strategy and, asked for, its probabilities at
every information state. The periodic evaluation during training runs the same matches
(`sparring.eval.periodic.against_bots`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sparring.envs import env_entry, has_game_tree, make
from sparring.envs.bots import check_opponents
from sparring.eval.games import (
    policy_conversion_vs_minimax,
    policy_exploitability,
    policy_strategy,
)
from sparring.eval.periodic import (
    against_bots,
    env_options,
    env_seats,
    seat_players,
    seat_profile,
)
from sparring.rollout.rollouts import make_arena, rollout_sampling


def print_evaluation(console: Console, policies: dict[str, Any], cfg: Any, ckpt: Path, *,
                     vs: Sequence[str], envs: Sequence[str] = (), games: int = 400,
                     policy: str | None = None, sample: bool = False, seed: int = 0,
                     strategy: bool = False) -> None:
    """Play ``policies`` (`sparring.assembly.trained.load_policies`'s mapping, ``{'': policy}``
    for a run with one) from checkpoint ``ckpt`` of the run ``cfg`` against the bots ``vs``
    in ``envs`` (default: the run's games), ``games`` games each, greedy unless ``sample``;
    ``policy``: only that one of a run with several. Prints the report on ``console``."""
    several = bool(cfg.policies)
    chosen = [policy] if policy else list(policies)  # ['']: a run with one policy
    envs = list(envs) or list(dict.fromkeys(env_entry(s.name).name for s in cfg.envs))
    for env in envs:  # every bot can play every game, before any is played
        check_opponents("--vs", vs, game=make(env, **env_options(cfg, env)))
    arena = make_arena(cfg.rollout)
    sampling = rollout_sampling(cfg.rollout, greedy=not sample)
    table = Table(title=f"{ckpt} ({games} games each, Wilson 95% intervals)")
    for col in ("env", *(("policy",) if several else ()), "opponent", "win", "draw", "loss",
                "non-loss", "forfeit", "invalid"):
        table.add_column(col)
    blunders: list = []  # (env, policy, Blunder) against minimax
    converted: list = []  # (env, policy, [WonPosition]) against minimax
    for env in envs:
        opts, seats = env_options(cfg, env), env_seats(cfg, env) if several else []
        # a policy plays its own seats of the run's games (all seats of another game)
        for name, mine in seat_players(chosen, seats):
            res = against_bots(arena, policies[name], env, opts, vs, games=games,
                               sampling=sampling, bot_seed=seed, game_seed=seed,
                               seats=mine, exact_minimax=True, greedy=not sample, key="--vs")
            for bot in vs:
                r = res[bot]
                table.add_row(env, *((name,) if several else ()), bot,
                              *(f"{r[k]:.3f} [{r[k + '_lo']:.3f}, {r[k + '_hi']:.3f}]"
                                for k in ("win", "draw", "loss", "non_loss")),
                              f"{r['forfeit_rate']:.3f}", f"{r['invalid_rate']:.3f}")
                if bot == "minimax":  # the same match without sampling error
                    exact = res["minimax_exact"]
                    x = exact.rates()
                    table.add_row(env, *((name,) if several else ()), "minimax (exact)",
                                  *(f"{x[k]:.3f}" for k in ("win", "draw", "loss", "non_loss")),
                                  "-", "-")
                    blunders.extend((env, name, b) for b in exact.blunders)
                    converted.append((env, name, policy_conversion_vs_minimax(
                        arena, policies[name], env, opts, not sample, mine or range(2))))
        if has_game_tree(env):
            profile = seat_profile(policies if seats else {"": policies[chosen[0]]}, seats)
            console.print(f"{env} exploitability: "
                          f"{policy_exploitability(arena, profile, env, opts):.4f}")
            if strategy:
                moves = policy_strategy(arena, profile, env, opts)
                console.print(f"{env} strategy: the probability of each legal move at every "
                              "information state", highlight=False)
                for info, probs in moves.items():
                    console.print(f"  {info:<{max(map(len, moves))}}  " + "  ".join(
                        f"{a} {p:.2f}" for a, p in probs.items()), highlight=False)
    console.print(table)
    if blunders:
        console.print(f"{len(blunders)} positions where the policy plays a losing move "
                      "against minimax (seat: observation -> move, its probability, the "
                      "seat's minimax value before -> after):")
        # positions the policy sees alike (a game's option canonical) print once, counted
        lines = Counter(f"  {env}{f' {name}' if several else ''} seat {b.seat}: "
                        f"{b.observation!r} -> {b.action} (p {b.prob:.2f}, "
                        f"{b.value_before:+g} -> {b.value_after:+g})"
                        for env, name, b in blunders)
        for line, n in list(lines.items())[:20]:
            console.print(line + (f" x{n} positions" if n > 1 else ""), highlight=False)
        if len(lines) > 20:
            console.print(f"  ... and {len(lines) - 20} more")
    for env, name, won in converted:
        for seat in sorted({p.seat for p in won}):
            w = [p.win for p in won if p.seat == seat]
            console.print(f"{env}{f' {name}' if several else ''} seat {seat} converts the "
                          f"{len(w)} won positions of its first 3 moves against minimax with "
                          f"mean win probability {sum(w) / len(w):.3f} "
                          f"({sum(x < 0.5 for x in w)} below 0.5)", highlight=False)
