"""Command line: ``sparring list|train|eval|play|report``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

LISTABLE = ("estimators", "shapers", "objectives", "aggregations", "envs", "bots")


def _registry_entries(what: str) -> list:
    if what == "estimators":
        from sparring.advantages import list_estimators
        return list_estimators()
    if what == "shapers":
        from sparring.advantages.shaping import SHAPERS
        return list(SHAPERS)
    if what == "objectives":
        from sparring.objectives import list_objectives
        return list_objectives()
    if what == "aggregations":
        from sparring.aggregation import AGGREGATIONS
        return list(AGGREGATIONS)
    if what == "bots":
        from sparring.envs.bots import BOTS
        return list(BOTS)
    from sparring.envs import list_envs
    return list_envs()


def cmd_list(args: argparse.Namespace) -> int:
    console = Console(width=200 if not sys.stdout.isatty() else None)
    for what in args.what or LISTABLE:
        try:
            entries = _registry_entries(what)
        except ImportError as e:
            console.print(f"[yellow]{what}: not available ({e})[/yellow]")
            continue
        aliases = any(e.aliases for e in entries)
        table = Table(title=f"{what} ({len(entries)})", show_lines=False)
        for col in ("name", *(("aliases",) if aliases else ()), "family", "needs", "source"):
            table.add_column(col, overflow="fold")
        for e in entries:
            alias = (", ".join(e.aliases) or "-",) if aliases else ()
            table.add_row(e.name, *alias, e.family, ", ".join(e.needs) or "-", e.source)
        console.print(table)
    return 0


def _split_train_args(items: Sequence[str]) -> tuple[str | None, list[str]]:
    """``[CONFIG] [key=value ...]``: CONFIG is a YAML path or a recipe name in configs/."""
    if not items or "=" in items[0]:
        return None, list(items)
    return items[0], list(items[1:])


def _recipe_dirs() -> list[Path]:
    """Where recipe names are looked up: ./configs, then the checkout's configs/."""
    here = Path("configs")
    repo = Path(__file__).resolve().parents[2] / "configs"
    return [here] + ([repo] if repo.is_dir() and repo.resolve() != here.resolve() else [])


def _resolve_config(name: str | None) -> Path | None:
    if name is None:
        name = "default"
    elif Path(name).is_file():
        return Path(name)
    for d in _recipe_dirs():
        for cand in (d / f"{name}.yaml", d / name):
            if cand.is_file():
                return cand
    if name == "default":
        return None
    raise FileNotFoundError(f"no config {name!r} (not a file, not configs/{name}.yaml)")


def cmd_train(args: argparse.Namespace) -> int:
    from sparring.train.config import ConfigError, commented_yaml, load_config, to_dict

    console = Console(stderr=True, soft_wrap=True)
    if args.print_defaults:
        print(commented_yaml())
        return 0
    name, overrides = _split_train_args(args.items)
    try:
        if args.resume:
            if name is not None:
                raise ConfigError("--resume takes the run's own config; give only overrides")
            cfg = load_config(Path(args.resume) / "config.yaml", overrides)
        else:
            cfg = load_config(_resolve_config(name), overrides)
    except (ConfigError, FileNotFoundError) as e:
        console.print(f"[red]config error:[/red] {e}")
        return 2
    if args.print_config:
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
        return 0
    from sparring.train.loop import _run_dir, resume, train
    from sparring.train.setup import build

    run_dir = Path(args.resume) if args.resume else _run_dir(cfg)
    try:
        parts = build(cfg, run_dir)
    except ValueError as e:
        console.print(f"[red]config error:[/red] {e}")
        return 2
    if args.resume:
        run = resume(args.resume, parts.model, parts.rollout_fn, parts.eval_fn, parts.stateful,
                     overrides=overrides, pad_id=parts.pad_id)
    else:
        run = train(cfg, parts.model, parts.rollout_fn, parts.eval_fn, parts.stateful,
                    run_dir=run_dir, pad_id=parts.pad_id)
        from sparring.train.summary import print_summary

        print_summary(run, console)
    console.print(f"run folder: {run}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from sparring.report import write_report

    try:
        path = write_report(args.run_dir, args.out)
    except FileNotFoundError as e:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {e}")
        return 2
    print(path)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from sparring.envs import env_entry, has_game_tree
    from sparring.envs.bots import BOTS, make_bot
    from sparring.eval.games import evaluate_vs_bot, policy_exploitability
    from sparring.eval.periodic import env_options
    from sparring.registry import UnknownNameError
    from sparring.rollout.schedule import make_arena
    from sparring.train.restore import load_policy

    console = Console()
    try:
        unknown = [b for b in args.vs if b not in BOTS]
        if unknown:
            raise ValueError(f"--vs: unknown {unknown}; allowed: {', '.join(BOTS.names())}")
        envs = [env_entry(e).name for e in args.env or []]
        policy, cfg, ckpt = load_policy(args.checkpoint)
    except (FileNotFoundError, ValueError, UnknownNameError) as e:
        console.print(f"[red]error:[/red] {e}")
        return 2
    envs = envs or list(dict.fromkeys(env_entry(s.name).name for s in cfg.envs))
    arena = make_arena(cfg.rollout)
    from sparring.policy.sampling import SamplingParams

    sampling = SamplingParams(temperature=cfg.rollout.temperature, greedy=not args.sample,
                              max_new_tokens=cfg.rollout.max_new_tokens)
    table = Table(title=f"{ckpt} ({args.games} games each, Wilson 95% intervals)")
    for col in ("env", "opponent", "win", "draw", "loss", "non-loss", "invalid"):
        table.add_column(col)
    for env in envs:
        opts = env_options(cfg, env)
        for bot in args.vs:
            r = evaluate_vs_bot(arena, policy, sampling, env, opts, make_bot(bot, args.seed),
                                args.games, seed=args.seed)
            table.add_row(env, bot, *(f"{r[k]:.3f} [{r[k + '_lo']:.3f}, {r[k + '_hi']:.3f}]"
                                      for k in ("win", "draw", "loss", "non_loss")),
                          f"{r['invalid_rate']:.3f}")
        if has_game_tree(env):
            console.print(f"{env} exploitability: "
                          f"{policy_exploitability(arena, policy, env, opts):.4f}")
    console.print(table)
    return 0


def cmd_play(args: argparse.Namespace) -> int:
    from sparring.envs import env_entry
    from sparring.play import play
    from sparring.registry import UnknownNameError
    from sparring.train.restore import load_policy

    try:
        env = env_entry(args.env).name if args.env else None
        policy, cfg, _ = load_policy(args.checkpoint)
    except (FileNotFoundError, UnknownNameError) as e:
        Console(stderr=True).print(f"[red]error:[/red] {e}")
        return 2
    env = env or cfg.envs[0].name
    play(policy, cfg, env, human_seat=args.seat, greedy=not args.sample, seed=args.seed)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "list": cmd_list, "train": cmd_train, "report": cmd_report, "eval": cmd_eval,
    "play": cmd_play}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sparring", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    lp = sub.add_parser("list", help="list estimators, shapers, objectives, aggregations, "
                        "environments, bots")
    lp.add_argument("what", nargs="*", choices=LISTABLE, help="what to list (default: all)")
    tp = sub.add_parser("train", help="train a policy: sparring train [CONFIG] [key.sub=value ...]")
    tp.add_argument("items", nargs="*", metavar="CONFIG|key=value",
                    help="a YAML file or a recipe name in configs/, then overrides")
    tp.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR")
    tp.add_argument("--print-config", action="store_true",
                    help="print the resolved config and exit")
    tp.add_argument("--print-defaults", action="store_true",
                    help="print every key with its default and help, and exit")
    rp = sub.add_parser("report", help="plots and a markdown summary of a run")
    rp.add_argument("run_dir", metavar="RUN_DIR")
    ep = sub.add_parser("eval", help="evaluate a trained policy against bots")
    ep.add_argument("checkpoint", metavar="CHECKPOINT", help="a run folder or a checkpoint folder")
    ep.add_argument("--vs", type=lambda s: [x for x in s.split(",") if x], default=["random"],
                    help="comma-separated bots (`sparring list bots`): random, minimax, mcts, cfr")
    ep.add_argument("--env", action="append",
                    help="environment, its name or an alias (default: the run's games)")
    ep.add_argument("--games", type=int, default=400, help="games per opponent (seats rotate)")
    ep.add_argument("--sample", action="store_true", help="sample instead of greedy moves")
    ep.add_argument("--seed", type=int, default=0)
    pp = sub.add_parser("play", help="play against a trained policy in the terminal")
    pp.add_argument("checkpoint", metavar="CHECKPOINT", help="a run folder or a checkpoint folder")
    pp.add_argument("--env", help="game, its name or an alias (default: the run's first "
                    "environment)")
    pp.add_argument("--seat", type=int, default=0, help="your seat (0 moves first)")
    pp.add_argument("--sample", action="store_true", help="the model samples instead of argmax")
    pp.add_argument("--seed", type=int, default=0)
    rp.add_argument("--out", default=None, help="output folder (default: RUN_DIR/report)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return COMMANDS[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
