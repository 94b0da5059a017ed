"""Start-state components (``envs[].starts``): how a training episode's game begins.

Each entry of ``envs[].starts`` is ``{name: ..., option: value, ...}``, one of `STARTS`
(``sparring list starts``), each name at most once; evaluation always plays the plain game.

* ``random_opening`` (``moves``): exploring starts, after 0..moves random legal moves;
* ``openings`` (``file``, ``share``): after one of a file's listed openings
  (`sparring.envs.openings`);
* ``loss_replay`` (``share``, ``size``, ``depth``): again from a position where a trained
  seat went on to lose in an earlier step (`sparring.rollout.loss_replay` keeps them);
* ``symmetric_views``: each seat sees the board through its own random symmetry.

A group's start (one draw from its reset seed, shared by its episodes;
`sparring.envs.wrappers.RandomOpening`): a replayed position with loss_replay's share, else
a listed opening with openings' share, else random_opening's moves (none without it),
whatever the order of the list; symmetric_views applies beneath all of them.

A component is a frozen dataclass whose fields are its options (`sparring.registry.option`:
help and bounds); ``check(game)`` raises ValueError where the game cannot start that way,
``wrap(game)`` is the game its episodes play (default: the game itself), and
``opening`` the keywords it gives `RandomOpening` (none: it plays no opening). A plugin
registers its own with ``@STARTS.register(name)`` on such a class.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparring.envs.base import Env
from sparring.envs.views import SymmetricViews
from sparring.envs.wrappers import RandomOpening, check_openings
from sparring.registry import Registry, build_component, option

STARTS = Registry("start")


class Start:
    """What every start component has (module docstring); subclasses are dataclasses."""

    name = ""

    def check(self, game: Env, options: dict[str, Any]) -> None:
        """Raise ValueError where ``game`` (built with ``options``) cannot start this way."""

    def wrap(self, game: Env) -> Env:
        return game

    @property
    def opening(self) -> dict[str, Any]:
        """Keywords of `RandomOpening` this component sets ({}: no opening)."""
        return {}


@STARTS.register("random_opening", source="Sutton & Barto (exploring starts)")
@dataclass(frozen=True, kw_only=True)
class RandomOpeningStart(Start):
    """Exploring starts: 0..moves random legal moves before the first turn."""

    name = "random_opening"
    moves: int = option(4, "a group's episodes begin after n random legal moves, n uniform "
                        "in 0..moves, never a move that ends the game (games that pay at "
                        "the end; 0: none)", ge=0)

    def check(self, game: Env, options: dict[str, Any]) -> None:
        if self.moves:
            RandomOpening(game, self.moves)

    @property
    def opening(self) -> dict[str, Any]:
        return {"max_moves": self.moves} if self.moves else {}


@STARTS.register("openings")
@dataclass(frozen=True, kw_only=True)
class ListedOpeningsStart(Start):
    """Listed openings: a group starts after one of a file's openings."""

    name = "openings"
    file: str = option("", "a file of openings, one per line, moves separated by spaces "
                       "(relative to the working directory or the checkout, e.g. "
                       "configs/openings/...); one of them is drawn uniformly")
    share: float = option(1.0, "probability a group starts from a listed opening (else "
                          "random_opening's moves)", ge=0, le=1)

    def __post_init__(self) -> None:
        if not self.file:
            raise ValueError("option 'file' is required (a file of openings)")

    def listed(self) -> tuple[tuple[str, ...], ...]:
        from sparring.envs.openings import read_openings
        return read_openings(self.file)

    def check(self, game: Env, options: dict[str, Any]) -> None:
        try:
            check_openings(game, self.listed())
        except OSError as e:
            raise ValueError(str(e)) from None

    @property
    def opening(self) -> dict[str, Any]:
        return {"listed": self.listed(), "listed_share": self.share}


@STARTS.register("loss_replay", source="ours (after Prioritized Level Replay, Jiang et al. 2021)")
@dataclass(frozen=True, kw_only=True)
class LossReplayStart(Start):
    """Loss replay: groups start again where a trained seat went on to lose."""

    name = "loss_replay"
    share: float = option(0.5, "probability a group starts from a replayed position (drawn "
                          "before listed and random openings)", gt=0, le=1)
    size: int = option(256, "distinct positions kept, the latest first", ge=1)
    depth: int = option(2, "a losing seat's last decisions kept from each lost game", ge=1)

    def check(self, game: Env, options: dict[str, Any]) -> None:
        if game.num_seats < 2:
            raise ValueError(f"{game.name} has one seat, so no game is lost to another seat; "
                             "loss replay needs two or more")
        RandomOpening(game, 0)  # replayed starts are played through it

    @property
    def opening(self) -> dict[str, Any]:
        return {"replayed_share": self.share}


@STARTS.register("symmetric_views")
@dataclass(frozen=True, kw_only=True)
class SymmetricViewsStart(Start):
    """Each seat sees the board through its own random symmetry of the game."""

    name = "symmetric_views"

    def check(self, game: Env, options: dict[str, Any]) -> None:
        if options.get("canonical"):
            raise ValueError("the game's option canonical already shows every position in "
                             "one orientation, and random views would undo it; drop one")
        SymmetricViews(game)

    def wrap(self, game: Env) -> Env:
        return SymmetricViews(game)


def parse_starts(specs: Sequence[dict[str, Any]]) -> list[Start]:
    """The components of an ``envs[].starts`` list; ValueError naming the entry
    (``"1: ..."``, its index) that is not one."""
    out: list[Start] = []
    for i, spec in enumerate(specs):
        try:
            part = build_component(STARTS, spec)
        except (KeyError, ValueError) as e:
            raise ValueError(f"{i}: {e}") from None
        if any(p.name == part.name for p in out):
            raise ValueError(f"{i}: {part.name!r} is given twice; give each start once")
        out.append(part)
    return out


def check_starts(parts: Sequence[Start], game: Env, options: dict[str, Any]) -> None:
    """Each part checked against ``game`` (built with ``options``): those that wrap it
    first, in order, each seeing the views of the ones before, then the others on the game
    as its episodes play it; ValueError naming the part's index."""
    wrapping = [i for i, p in enumerate(parts) if type(p).wrap is not Start.wrap]
    for i in [*wrapping, *(i for i in range(len(parts)) if i not in wrapping)]:
        try:
            parts[i].check(game, options)
        except ValueError as e:
            raise ValueError(f"{i}: {parts[i].name}: {e}") from None
        game = parts[i].wrap(game)


def start_env(game: Env, parts: Sequence[Start],
              replayed: Sequence[tuple[int, Sequence[str]]] = ()) -> Env:
    """``game`` as a training episode with ``parts`` plays it: through the views of those that
    wrap it, then after an opening (`RandomOpening`) where any sets one; ``replayed``: the
    loss replay's positions."""
    for part in parts:
        game = part.wrap(game)
    opening: dict[str, Any] = {}
    for part in parts:
        opening.update(part.opening)
    if not opening:
        return game
    return RandomOpening(game, opening.pop("max_moves", 0), replayed=replayed, **opening)


__all__ = ["STARTS", "LossReplayStart", "ListedOpeningsStart", "RandomOpeningStart", "Start",
           "SymmetricViewsStart", "check_starts", "parse_starts", "start_env"]
