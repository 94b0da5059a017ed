"""Command line: ``sparring list|train|eval|play|report``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.table import Table

LISTABLE = ("estimators", "shapers", "objectives", "aggregations", "envs")


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
    from sparring.envs import list_envs  # type: ignore[attr-defined]
    return list_envs()


def cmd_list(args: argparse.Namespace) -> int:
    console = Console(width=200 if not sys.stdout.isatty() else None)
    for what in args.what or LISTABLE:
        try:
            entries = _registry_entries(what)
        except ImportError as e:
            console.print(f"[yellow]{what}: not available ({e})[/yellow]")
            continue
        table = Table(title=f"{what} ({len(entries)})", show_lines=False)
        for col in ("name", "family", "needs", "source"):
            table.add_column(col, overflow="fold")
        for e in entries:
            table.add_row(e.name, e.family, ", ".join(e.needs) or "-", e.source)
        console.print(table)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"list": cmd_list}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sparring", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    lp = sub.add_parser("list", help="list estimators, shapers, objectives, aggregations, environments")
    lp.add_argument("what", nargs="*", choices=LISTABLE, help="what to list (default: all)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return COMMANDS[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
