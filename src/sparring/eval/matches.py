"""The match runner: any players, N paired seeds, every seating, batched across games.

Games are played by the `Arena` (the one episode driver), all at once: every step, one
``generate`` call per model policy over all games where it is to move; bots act at once.
A player is anything the arena takes (`sparring.rollout.players`): a `ModelPlayer`, a
policy (``generate`` + ``tokenizer``), a `BotPlayer` or a bot callable
``bot(env, seat) -> str`` (the bots of `sparring.envs.bots`). A model's illegal or
unparsable answer forfeits the game (the seat gets ``penalty``, the episode ends:
invalid-action mode ``forfeit``); a bot's is a bug and raises.

Every seed is played once in every cyclic seating of the players (paired seeds: the same
deal with the seats swapped), so seat advantage and deal luck cancel in the totals.
A game's outcome for a player: win (unique best return), draw (tied best), loss; returns
are the arena's per-seat totals (the game's rewards plus the forfeit penalty). A seat that
forfeits loses whatever the returns (with ``penalty=0`` a forfeit before any reward would
otherwise tie); the other seats are ranked among themselves.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sparring.envs.invalid import InvalidActionPolicy
from sparring.eval.stats import elo_ratings, wilson
from sparring.rollout.arena import Arena
from sparring.rollout.players import as_player

MAX_TURNS = 10_000  # per game: a match plays games to their end


@dataclass
class Record:
    """Wins/draws/losses and returns of one player (overall or in one seat)."""

    wins: int = 0
    draws: int = 0
    losses: int = 0
    forfeits: int = 0
    return_sum: float = 0.0

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    @property
    def mean_return(self) -> float:
        return self.return_sum / self.games if self.games else 0.0

    def rate(self, what: str = "wins") -> tuple[float, tuple[float, float]]:
        """(proportion, Wilson 95% interval) of ``wins``, ``draws`` or ``losses``."""
        k = getattr(self, what)
        return (k / self.games if self.games else 0.0), wilson(k, self.games)


@dataclass
class GameLog:
    seed: int
    seating: tuple[str, ...]  # player name per seat
    returns: list[float]
    forfeit: int | None = None


@dataclass
class MatchResult:
    players: list[str]
    overall: dict[str, Record] = field(default_factory=dict)
    per_seat: dict[tuple[str, int], Record] = field(default_factory=dict)
    games: list[GameLog] = field(default_factory=list)

    def pairwise(self) -> list[tuple[str, str, float]]:
        """(i, j, score of i) for every pair of seats in every game, for Elo; a seat that
        forfeited loses to every other."""
        out = []
        for g in self.games:
            for a in range(len(g.seating)):
                for b in range(a + 1, len(g.seating)):
                    ra, rb = g.returns[a], g.returns[b]
                    score = 1.0 if ra > rb else 0.5 if ra == rb else 0.0
                    if g.forfeit in (a, b):
                        score = 0.0 if g.forfeit == a else 1.0
                    out.append((g.seating[a], g.seating[b], score))
        return out

    def elo(self, prior: float = 1.0) -> dict[str, float]:
        return elo_ratings(self.pairwise(), prior=prior)

    def merge(self, other: MatchResult) -> MatchResult:
        """Combine results (e.g. of a round robin) into one."""
        out = MatchResult(list(dict.fromkeys(self.players + other.players)))
        for res in (self, other):
            for g in res.games:
                _record(out, g)
        return out

    def table(self) -> str:
        lines = ["player        seat  games   win [95% CI]          draw   loss   mean return"]
        rows = [(p, None, self.overall[p]) for p in self.players]
        rows += [(p, s, r) for (p, s), r in sorted(self.per_seat.items(), key=lambda kv: kv[0][1])]
        for p, s, r in sorted(rows, key=lambda x: (self.players.index(x[0]), -1 if x[1] is None else x[1])):
            w, (lo, hi) = r.rate("wins")
            lines.append(f"{p[:13]:13s} {'all' if s is None else s:>4}  {r.games:5d}   "
                         f"{w:5.3f} [{lo:5.3f}, {hi:5.3f}]  {r.draws / max(r.games, 1):5.3f}  "
                         f"{r.losses / max(r.games, 1):5.3f}  {r.mean_return:+.4f}")
        return "\n".join(lines)


def _record(res: MatchResult, g: GameLog) -> None:
    res.games.append(g)
    ranked = [r for s, r in enumerate(g.returns) if s != g.forfeit]  # a forfeit ranks last
    best = max(ranked) if ranked else None
    n_best = sum(r == best for r in ranked)
    for seat, name in enumerate(g.seating):
        r = g.returns[seat]
        for rec in (res.overall.setdefault(name, Record()), res.per_seat.setdefault((name, seat), Record())):
            if seat == g.forfeit:
                rec.losses += 1
            elif r == best and n_best == 1:
                rec.wins += 1
            elif r == best:
                rec.draws += 1
            else:
                rec.losses += 1
            rec.return_sum += r
            rec.forfeits += g.forfeit == seat


def _names(players: Sequence[Any] | dict[str, Any]) -> tuple[list[str], list[Any]]:
    if isinstance(players, dict):
        return list(players), list(players.values())
    names, seen = [], defaultdict(int)
    for p in players:
        base = getattr(p, "name", None) or type(p).__name__
        seen[base] += 1
        names.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return names, list(players)


def play_match(game: str | Callable[[], Any], players: Sequence[Any] | dict[str, Any],
               games: int = 100, seed: int = 0, swap_seats: bool = True,
               penalty: float = -1.0, options: dict[str, Any] | None = None) -> MatchResult:
    """Play ``games`` seeds (``seed``, ``seed + 1``, ...), each in every cyclic seating of
    ``players`` (one seating when ``swap_seats`` is False), all in one `Arena.run_episodes` call.
    ``game``: a registered env name or alias (``options`` go to its factory) or a
    zero-argument factory."""
    from sparring.envs import make

    names, objs = _names(players)
    seated = [replace(as_player(p), name=n) for n, p in zip(names, objs)]  # match names
    if games < 1:
        raise ValueError(f"play_match: games must be >= 1, got {games}")
    probe = make(game, **(options or {})) if isinstance(game, str) else game()
    if len(objs) != probe.num_seats:
        raise ValueError(f"{probe.name} has {probe.num_seats} seats but {len(objs)} players were given")
    k = len(objs)
    seatings = [tuple((i + r) % k for i in range(k)) for r in (range(k) if swap_seats else [0])]
    arena = Arena(invalid=InvalidActionPolicy("forfeit", penalty), max_turns=MAX_TURNS)
    episodes = arena.run_episodes(
        game, dict(options or {}), seeds=[s for s in range(seed, seed + games) for _ in seatings],
        players_fn=lambda i: [seated[q] for q in seatings[i % len(seatings)]])
    result = MatchResult(names)
    for i, ep in enumerate(episodes):
        seating = tuple(names[q] for q in seatings[i % len(seatings)])
        _record(result, GameLog(ep.seed, seating, list(ep.returns), ep.info.get("forfeit")))
    return result


def round_robin(game: str | Callable[[], Any], players: dict[str, Any], games: int = 100,
                seed: int = 0, options: dict[str, Any] | None = None) -> MatchResult:
    """Every pair of ``players`` plays a two-seat ``game`` (both seatings, paired seeds)."""
    names = list(players)
    if len(names) < 2:
        raise ValueError("round_robin needs at least two players")
    out = MatchResult(names)
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            pair = {names[a]: players[names[a]], names[b]: players[names[b]]}
            out = out.merge(play_match(game, pair, games, seed, options=options))
    out.players = names
    return out
