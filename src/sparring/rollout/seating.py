"""Seat rotation: the learner against other players, every seat played equally often.

Episode ``i`` of a batch puts the learner in seat ``learner_seat(i, num_seats) = i % num_seats``
and an opponent in every other seat, so a batch of ``k * num_seats`` episodes plays each
seat ``k`` times and seat advantage cancels in the totals. ``seats``: rotate over those
seats only (``seats[i % len(seats)]``; a policy that plays only some roles of a game, or
``envs[].learner_seats``, where a repeated seat is played more often).
Used by the rollout schedule (bots, the opponent pool) and by evaluation against bots.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def learner_seat(episode: int, num_seats: int, seats: Sequence[int] | None = None) -> int:
    """The learner's seat in episode ``episode`` of a rotating batch."""
    if seats is not None:
        return seats[episode % len(seats)]
    return episode % num_seats


def rotating(learner: Any, opponent: Callable[[], Any], num_seats: int,
             seats: Sequence[int] | None = None) -> Callable[[int], list[Any]]:
    """An ``Arena.run_episodes(players_fn=...)`` chooser: episode ``i`` has ``learner`` in seat
    ``learner_seat(i, num_seats, seats)`` and ``opponent()`` (called once per other seat, in
    seat order: a fixed player, or one sampled from a pool) everywhere else. ``learner``:
    one player, or a list with the player of each seat (several policies: the rotating
    seat gets its own)."""

    def choose(i: int) -> list[Any]:
        me = learner_seat(i, num_seats, seats)
        mine = learner[me] if isinstance(learner, list | tuple) else learner
        return [mine if s == me else opponent() for s in range(num_seats)]

    return choose
