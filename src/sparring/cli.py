"""Command line: ``sparring list|train|eval|play|report|export|sweep`` and ``sparring --version``.

`main` is the boundary between the user and the code: a user error (a bad config or
argument, a missing or unwritable file, a full disk, a locked or unresumable run folder)
is one line on stderr naming the key or the file, exit code 2; Ctrl-C is exit code 130.
``--debug`` (before or after the command) shows the full traceback instead.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

LISTABLE = ("estimators", "shapers", "objectives", "aggregations", "envs", "bots", "starts",
            "heads")


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
    if what == "starts":
        from sparring.envs.starts import STARTS
        return list(STARTS)
    if what == "heads":
        from sparring.policy.heads import HEADS
        return list(HEADS)
    from sparring.envs import list_envs
    return list_envs()


def cmd_list(args: argparse.Namespace) -> int:
    console = Console(width=200 if not sys.stdout.isatty() else None)
    from sparring.plugins import PluginError
    from sparring.registry import describe_options

    unknown = [w for w in args.what if w not in LISTABLE]
    try:
        if unknown:
            raise ValueError(f"list: unknown {', '.join(map(repr, unknown))}; allowed: "
                             f"{', '.join(LISTABLE)}")
        _import_plugins(args)
    except (PluginError, ValueError) as e:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {e}")
        return 2
    for what in args.what or LISTABLE:
        try:
            entries = _registry_entries(what)
        except ImportError as e:
            console.print(f"[yellow]{what}: not available ({e})[/yellow]")
            continue
        aliases = any(e.aliases for e in entries)
        options = [describe_options(e.fn) for e in entries]  # of registered components
        table = Table(title=f"{what} ({len(entries)})", show_lines=False)
        for col in ("name", *(("aliases",) if aliases else ()),
                    *(("options",) if any(options) else ("family", "needs")), "source"):
            table.add_column(col, overflow="fold")
        for e, opts in zip(entries, options):
            alias = (", ".join(e.aliases) or "-",) if aliases else ()
            middle = ((", ".join(f"{k}={v!r}" for k, v, _ in opts) or "-",) if any(options)
                      else (e.family, ", ".join(e.needs) or "-"))
            table.add_row(e.name, *alias, *middle, e.source)
        console.print(table)
    return 0


def _split_train_args(items: Sequence[str]) -> tuple[str | None, list[str]]:
    """``[CONFIG] [key=value ...]``: CONFIG is a YAML path or a recipe name in configs/."""
    if not items or "=" in items[0]:
        return None, list(items)
    return items[0], list(items[1:])


def _import_plugins(args: argparse.Namespace) -> None:
    """``--plugin`` modules, imported before any config is read (`sparring.plugins`)."""
    from sparring.plugins import import_plugins

    import_plugins(getattr(args, "plugin", None) or [])


def cmd_train(args: argparse.Namespace) -> int:
    """``sparring train``; under ``torchrun`` every rank runs it: rank 0 runs the run and
    sends the other learner ranks its config (None when there is no run to take part in),
    and they take part in its updates (`sparring.train.learner_ranks`)."""
    from sparring.config import commented_yaml
    from sparring.train.learner_ranks import LEADER, share, torchrun_ranks

    console = Console(stderr=True, soft_wrap=True)
    if args.print_defaults:
        print(commented_yaml())
        return 0
    with torchrun_ranks() as ranks:
        if ranks is not None and ranks.rank != LEADER:
            return _follow_leader(args)
        cfg = None
        try:
            cfg = _train_config(args, console)
            if cfg is not None and ranks is not None and cfg.distributed.learner_ranks > 1:
                raise CommandError(f"distributed.learner_ranks="
                                   f"{cfg.distributed.learner_ranks} under torchrun, which "
                                   f"started {ranks.size} ranks already: leave it at 1 "
                                   "(torchrun's ranks are the learner ranks)")
        finally:
            if ranks is not None:
                share(cfg if sys.exc_info()[0] is None else None)
        return 0 if cfg is None else _train_run(args, cfg, console)


def _follow_leader(args: argparse.Namespace) -> int:
    """A learner rank other than 0: the leader's config, then its updates."""
    from sparring.assembly.run import build_follower
    from sparring.train.learner_ranks import follow, share

    _import_plugins(args)
    cfg = share()
    if cfg is not None:
        follow(cfg, build_follower(cfg))
    return 0


def _train_config(args: argparse.Namespace, console: Console):
    """The run's config from the recipe and overrides (or ``--resume``'s folder), checked;
    None when ``--print-config`` printed it instead."""
    from sparring.config import (
        ConfigError,
        config_warnings,
        find_recipe,
        load_config,
        to_dict,
    )
    from sparring.plugins import PluginError

    name, overrides = _split_train_args(args.items)
    try:
        _import_plugins(args)
        if args.resume:
            if name is not None:
                raise ConfigError("--resume takes the run's own config; give only overrides")
            cfg = _resume_config(args, overrides)
        else:
            cfg = load_config(find_recipe(name), overrides)
        cfg.plugins += [p for p in args.plugin or [] if p not in cfg.plugins]  # kept in the run
    except PluginError as e:
        raise ConfigError(str(e)) from e
    if args.print_config:
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
        return None
    _check_device(cfg.model.device)
    for note in config_warnings(cfg):
        console.print(f"[yellow]warning:[/yellow] {note}")
    return cfg


def _train_run(args: argparse.Namespace, cfg, console: Console) -> int:
    """Build ``cfg``'s parts and train (or resume) its run; the summary at the end."""
    from sparring.assembly.run import build
    from sparring.storage.folders import CKPT_DIR
    from sparring.train.best import BEST_FILE
    from sparring.train.learner_ranks import Leader, stops_followers
    from sparring.train.loop import _run_dir, resume, train

    run_dir = Path(args.resume) if args.resume else _run_dir(cfg)
    with stops_followers(Leader.of_process_group()):  # they wait for the run's start
        if not args.resume:
            from sparring.train.runlock import check_run_dir

            check_run_dir(run_dir)  # before the model is built: a folder of someone else's
        parts = build(cfg, run_dir)
    console.print(f"precision: {parts.precision}", highlight=False)
    try:
        if args.resume:
            run = resume(args.resume, parts.model, parts.rollout_fn, parts.eval_fn,
                         parts.stateful, pad_id=parts.pad_id, cfg=cfg)
        else:
            run = train(cfg, parts.model, parts.rollout_fn, parts.eval_fn, parts.stateful,
                        run_dir=run_dir, pad_id=parts.pad_id)
        parts.close()
    except KeyboardInterrupt as e:
        from sparring.train.signals import Terminated

        if isinstance(e, Terminated):
            raise Interrupted(f"{e}; {_resume_hint(run_dir)}", code=143) from e
        raise Interrupted(f"interrupted; {_resume_hint(run_dir)}") from e
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        raise CommandError(f"no space left on device writing {e.filename or run_dir}; "
                           f"{_resume_hint(run_dir)}") from e
    if not args.resume:
        from sparring.report.summary import print_summary

        print_summary(run, console)
    console.print(f"run folder: {run}")
    best = Path(run) / CKPT_DIR / BEST_FILE
    if best.is_file():
        from sparring.storage.bounded import read_json_bounded

        b = read_json_bounded(best, what="best checkpoint record")
        console.print(f"best checkpoint: {Path(run) / CKPT_DIR / b['path']} "
                      f"({b['metric']} {b['value']:.4g} at step {b['step']})")
    return 0


class CommandError(Exception):
    """A user error whose message is already the one line to print."""


class Interrupted(Exception):
    """Ctrl-C (exit code 130) or SIGTERM (143), with a line saying what was kept."""

    def __init__(self, message: str, code: int = 130) -> None:
        super().__init__(message)
        self.code = code


def _resume_hint(run_dir: Path) -> str:
    """What survives in ``run_dir``: its newest checkpoint (written whole or not at all)."""
    from sparring.train.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir) if run_dir.is_dir() else None
    if ckpt is None:
        return "no checkpoint was written yet: start the run again"
    return (f"the last checkpoint, {ckpt}, is intact: continue with "
            f"`sparring train --resume {run_dir}`")


def _resume_config(args: argparse.Namespace, overrides: list[str]):
    """The config of ``--resume RUN_DIR`` plus ``overrides``, checked before anything is
    written: the folder has a checkpoint, the overrides leave the model's shape alone, and
    the folder runs no code of its own (its plugins and ``model.trust_remote_code`` count
    only with ``--trust-remote-code``; plugins named with ``--plugin`` are already loaded)."""
    from sparring.config import check_resume_overrides
    from sparring.config.run_folder import read_run_config
    from sparring.storage.folders import step_dirs

    run = Path(args.resume)
    if not run.is_dir():
        raise CommandError(f"--resume: no run folder {run}")
    if not os.path.lexists(run / "config.yaml"):  # (what is there is read with bounds)
        raise CommandError(f"--resume: {run} has no config.yaml (not a run folder)")
    if not step_dirs(run):
        raise CommandError(f"--resume: {run} has no checkpoint to resume from (a run stopped "
                           "before its first checkpoint starts again without --resume)")
    trust = args.trust_remote_code
    saved = read_run_config(run / "config.yaml", trust_remote_code=trust)
    cfg = read_run_config(run / "config.yaml", overrides, trust_remote_code=trust)
    check_resume_overrides(saved, cfg)
    given = {_plugin_key(p) for p in args.plugin or []}
    unloaded = [p for p in saved.plugins if _plugin_key(p) not in given]
    if unloaded and not trust:
        raise CommandError(f"--resume: {run / 'config.yaml'} lists plugins {unloaded}; a run "
                           "folder runs no code on its own: name them with --plugin, or pass "
                           "--trust-remote-code")
    return cfg


def _plugin_key(name: str) -> str:
    """A plugin as `sparring.plugins` finds it: a .py path resolved, a module by name."""
    return str(Path(name).resolve()) if name.endswith(".py") or "/" in name else name


def _check_device(device: str) -> None:
    """``model.device`` exists on this machine (a config may be valid for another one)."""
    from sparring.config import ConfigError
    from sparring.policy.hf import device_unavailable

    why = device_unavailable(device)
    if why:
        raise ConfigError(f"model.device: {device!r}, but {why} (use cpu or auto)")


def cmd_export(args: argparse.Namespace) -> int:
    from sparring.export import export

    try:
        _import_plugins(args)
        out = export(args.run_dir, args.out_dir, dtype=args.dtype, overwrite=args.overwrite,
                     trust_remote_code=args.trust_remote_code, policy=args.policy,
                     average=args.average)
    except (FileNotFoundError, FileExistsError, ValueError, ImportError) as e:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {e}")
        return 2
    print(out)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from sparring.report.plots import write_report

    if not Path(args.run_dir).is_dir():
        raise CommandError(f"no run folder {args.run_dir}")
    path = write_report(args.run_dir, args.out)
    print(path)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from sparring.assembly.trained import check_policy_name, load_policies
    from sparring.envs import env_entry
    from sparring.envs.bots import BOTS, check_opponents
    from sparring.eval.results_table import print_evaluation
    from sparring.registry import UnknownNameError

    console = Console(width=200 if not sys.stdout.isatty() else None)  # no wrapping in pipes
    if not args.vs:
        raise CommandError(f"--vs: name at least one bot ({', '.join(BOTS.names())})")
    check_opponents("--vs", args.vs)
    try:
        envs = [env_entry(e).name for e in args.env or []]
    except UnknownNameError as e:
        raise CommandError(f"--env: {e}") from None
    _import_plugins(args)
    policies, cfg, ckpt = load_policies(args.checkpoint, args.device,
                                        trust_remote_code=args.trust_remote_code,
                                        average=args.average)
    if args.policy is not None:
        check_policy_name(cfg, args.policy)
    print_evaluation(console, policies, cfg, ckpt, vs=args.vs, envs=envs, games=args.games,
                     policy=args.policy, sample=args.sample, seed=args.seed,
                     strategy=args.strategy)
    return 0


def cmd_play(args: argparse.Namespace) -> int:
    from sparring.assembly.trained import check_policy_name, load_policies
    from sparring.envs import env_entry
    from sparring.eval.periodic import env_seats
    from sparring.registry import UnknownNameError
    from sparring.terminal_game import play_in_terminal

    try:
        env = env_entry(args.env).name if args.env else None
    except UnknownNameError as e:
        raise CommandError(f"--env: {e}") from None
    if args.seat < 0:
        raise CommandError(f"--seat: must be >= 0, got {args.seat}")
    if sys.stdin is None or sys.stdin.closed:
        raise CommandError("play reads your moves from stdin, which is closed: run it in a "
                           "terminal or pipe the moves in")
    _import_plugins(args)
    policies, cfg, _ = load_policies(args.checkpoint, args.device,
                                     trust_remote_code=args.trust_remote_code,
                                     average=args.average)
    if args.policy is not None:
        check_policy_name(cfg, args.policy)
    env = env or cfg.envs[0].name
    seats = env_seats(cfg, env)
    if args.policy is not None or not cfg.policies:
        policy: Any = policies[args.policy or ""]
    elif seats:  # each model seat played by its own policy
        policy = [policies[n] for n in seats]
    else:
        raise CommandError(f"--policy: the run maps no seats of {env}; name the policy that "
                           f"plays the model's seats ({', '.join(cfg.policies)})")
    try:
        play_in_terminal(policy, cfg, env, human_seat=args.seat, greedy=not args.sample, seed=args.seed)
    except EOFError:  # Ctrl-D at the prompt
        print("\nend of input: game abandoned")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """`sparring sweep RECIPE --seeds 0-7 [overrides]`: the recipe over seeds, one table."""
    from sparring.sweep import parse_seeds, sweep

    text, failed = sweep(args.recipe, parse_seeds(args.seeds), args.overrides, jobs=args.jobs,
                         threads=args.threads, out=args.out, metrics=args.metric or (),
                         steps=args.steps)
    print(text)
    return 1 if failed else 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "list": cmd_list, "train": cmd_train, "report": cmd_report, "eval": cmd_eval,
    "play": cmd_play, "export": cmd_export, "sweep": cmd_sweep}


def build_parser() -> argparse.ArgumentParser:
    from sparring import __version__

    p = argparse.ArgumentParser(prog="sparring", description=__doc__)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                   help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True)
    lp = sub.add_parser("list", help="list estimators, shapers, objectives, aggregations, "
                        "environments, bots, start components, heads")
    # no argparse `choices`: Python 3.11 checks an empty `nargs="*"` against them and fails
    lp.add_argument("what", nargs="*", metavar="WHAT",
                    help=f"what to list: {', '.join(LISTABLE)} (default: all)")
    lp.add_argument("--plugin", action="append", metavar="MODULE",
                    help="import a module (or .py file) that registers its own entries first")
    tp = sub.add_parser("train", help="train a policy: sparring train [CONFIG] [key.sub=value ...]")
    tp.add_argument("items", nargs="*", metavar="CONFIG|key=value",
                    help="a YAML file or a recipe name in configs/, then overrides")
    tp.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR")
    tp.add_argument("--plugin", action="append", metavar="MODULE",
                    help="import a module (or .py file) that registers its own envs, "
                    "estimators, objectives or shapers before the config is checked "
                    "(repeatable; also the config key `plugins`)")
    tp.add_argument("--trust-remote-code", action="store_true",
                    help="with --resume: let the run folder's model code and plugins run "
                    "(off: its config.yaml cannot make them run)")
    tp.add_argument("--print-config", action="store_true",
                    help="print the resolved config and exit")
    tp.add_argument("--print-defaults", action="store_true",
                    help="print every key with its default and help, and exit")
    wp = sub.add_parser("sweep", help="run a recipe over seeds and summarise them: sparring "
                        "sweep RECIPE --seeds 0-7 --jobs 2 [key.sub=value ...]")
    wp.add_argument("recipe", metavar="RECIPE", help="a recipe name in configs/ or a YAML file")
    wp.add_argument("overrides", nargs="*", metavar="key=value", help="given to every seed")
    wp.add_argument("--seeds", default="0-7", help="seeds: 0-7, 0,2,5 or 0-3,8 (default 0-7)")
    wp.add_argument("--jobs", type=_positive_int, default=1, help="runs at a time (default 1)")
    wp.add_argument("--threads", type=_positive_int, default=None,
                    help="torch threads per run (default: the cores divided among the jobs)")
    wp.add_argument("--steps", type=_positive_int, default=None,
                    help="train.steps of every run (default: the recipe's)")
    wp.add_argument("--metric", action="append", metavar="KEY[:min|:max|>=X|<=X]",
                    help="a logged key to summarise, its direction or target (repeatable; "
                    "default: the runs' headline evaluation keys)")
    wp.add_argument("--out", default=None,
                    help="output folder (default: runs/sweeps/RECIPE-TIME); a seed finished "
                    "there with the same arguments is reused, and a folder the sweep did not "
                    "make, or made with other arguments, stops it (nothing is deleted)")
    xp = sub.add_parser("export", help="write a trained policy as a Hugging Face model folder "
                        "(LoRA merged, tokenizer and chat template included)")
    xp.add_argument("run_dir", metavar="RUN_DIR", help="a run folder or a checkpoint folder")
    xp.add_argument("out_dir", metavar="OUT_DIR", help="the folder to write")
    xp.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                    help="weights' dtype (default: the run's model.dtype)")
    xp.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")
    xp.add_argument("--trust-remote-code", action="store_true",
                    help="let the run folder's own code run: its model code, plugins and "
                    "\"module:attr\" references (off: its config.yaml cannot make them run)")
    xp.add_argument("--policy", metavar="NAME",
                    help="a run with several policies: the one to export")
    rp = sub.add_parser("report", help="plots and a markdown summary of a run")
    rp.add_argument("run_dir", metavar="RUN_DIR")
    ep = sub.add_parser("eval", help="evaluate a trained policy against bots")
    ep.add_argument("checkpoint", metavar="CHECKPOINT", help="a run folder or a checkpoint folder")
    ep.add_argument("--vs", type=lambda s: [x for x in s.split(",") if x], default=["random"],
                    help="comma-separated bots (`sparring list bots`): random, tactical, "
                    "minimax, mcts, cfr")
    ep.add_argument("--env", action="append",
                    help="environment, its name or an alias (default: the run's games)")
    ep.add_argument("--games", type=_games, default=400,
                    help="games per opponent (seats rotate)")
    ep.add_argument("--trust-remote-code", action="store_true",
                    help="let the run folder's own code run: its model code, plugins and "
                    "\"module:attr\" references (off: its config.yaml cannot make them run)")
    ep.add_argument("--sample", action="store_true", help="sample instead of greedy moves")
    ep.add_argument("--seed", type=int, default=0)
    ep.add_argument("--policy", metavar="NAME",
                    help="a run with several policies: evaluate this one (in its own seats; "
                    "default: each in turn)")
    ep.add_argument("--strategy", action="store_true",
                    help="games with a game tree (Kuhn, Leduc): also print the policy's "
                    "probability of each legal move at every information state")
    pp = sub.add_parser("play", help="play against a trained policy in the terminal")
    pp.add_argument("checkpoint", metavar="CHECKPOINT", help="a run folder or a checkpoint folder")
    pp.add_argument("--env", help="game, its name or an alias (default: the run's first "
                    "environment)")
    pp.add_argument("--seat", type=int, default=0, help="your seat (0 moves first)")
    pp.add_argument("--trust-remote-code", action="store_true",
                    help="let the run folder's own code run: its model code, plugins and "
                    "\"module:attr\" references (off: its config.yaml cannot make them run)")
    pp.add_argument("--sample", action="store_true", help="the model samples instead of argmax")
    pp.add_argument("--seed", type=int, default=0)
    pp.add_argument("--policy", metavar="NAME",
                    help="a run with several policies: this one plays every model seat "
                    "(default: each seat its own policy)")
    for sp in (ep, pp):
        sp.add_argument("--device", type=_device, help="where the model runs: cpu, cuda, cuda:N, mps or "
                        "auto (default: the run's model.device)")
    for sp in (xp, ep, pp):
        sp.add_argument("--plugin", action="append", metavar="MODULE",
                        help="import a module (or .py file) that registers the run's own "
                        "envs, estimators ... first (the run folder's `plugins` are not "
                        "imported without --trust-remote-code)")
        sp.add_argument("--average", action="store_true",
                        help="the run's average policy instead of its last one: the magnet "
                        "(algorithm.kl.reference=magnet), an average of its recent weights")
    rp.add_argument("--out", default=None, help="output folder (default: RUN_DIR/report)")
    p.add_argument("--debug", action="store_true",
                   help="show the full traceback of an error instead of one line")
    for sp in sub.choices.values():  # `sparring train ... --debug` works too
        sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the full traceback of an error instead of one line")
    return p


class _LowerLevelFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {record.getMessage()}"


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


MAX_EVAL_GAMES = 100_000  # per opponent and game; the default is 400


def _games(text: str) -> int:
    """``--games``: a whole number in [1, `MAX_EVAL_GAMES`]."""
    n = _positive_int(text)
    if n > MAX_EVAL_GAMES:
        raise argparse.ArgumentTypeError(f"at most {MAX_EVAL_GAMES:,} games per opponent, "
                                         f"got {n:,}")
    return n


def _device(text: str) -> str:
    """``--device``: a name torch parses as a device, or ``auto``."""
    if text != "auto":
        import torch
        try:
            torch.device(text)
        except (RuntimeError, ValueError):
            raise argparse.ArgumentTypeError(f"{text!r} is not a device (allowed: cpu, cuda, "
                                             "cuda:N, mps, auto)") from None
    return text


def _one_line(e: BaseException) -> str:
    """The message of ``e`` on one line; an OS error as 'what: which file'."""
    if isinstance(e, OSError) and e.strerror and e.filename is not None:
        files = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
        text = f"{e.strerror}: {files}"
    else:
        text = str(e) or type(e).__name__
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "the input is wrong", not "the code is wrong"."""
    from sparring.registry import UnknownNameError
    from sparring.train.runlock import NotARunFolderError, RunLockedError

    return (CommandError, ValueError, OSError, UnknownNameError, RunLockedError,
            NotARunFolderError, ImportError)


def main(argv: Sequence[str] | None = None) -> int:
    from sparring.lifeline import exit_with_parent

    exit_with_parent()  # a sweep's trainer ends with its sweep, however that is killed
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "sweep" and not any(e.startswith("-") for e in extra):
        args.overrides += extra  # overrides after the options: `--seeds 0-7 key=value`
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    debug = bool(getattr(args, "debug", False))
    root = logging.getLogger()
    if not root.handlers:  # warnings as "warning: ..." lines on stderr
        handler = logging.StreamHandler()
        handler.setFormatter(_LowerLevelFormatter())
        root.addHandler(handler)
        root.setLevel(logging.WARNING)
    try:
        return COMMANDS[args.command](args)
    except (KeyboardInterrupt, Interrupted) as e:
        if debug:
            raise
        print(f"\n{e if isinstance(e, Interrupted) else 'interrupted'}", file=sys.stderr)
        return e.code if isinstance(e, Interrupted) else 130
    except _user_errors() as e:
        if debug:
            raise
        from sparring.config import ConfigError

        kind = "config error" if isinstance(e, ConfigError) else "error"
        print(f"{kind}: {_one_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
