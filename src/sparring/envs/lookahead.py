"""Two-ply lookahead on copies of a game's state: the moves that do not throw a game away.

`tactical_actions(env, seat)`: of ``seat``'s legal moves, those that win at once if any;
else those after which the next mover has no move that wins at once; else all of them (every
move loses: none is singled out). "Wins" = the game ends with the mover's return above every
other seat's. Needs ``env.clone()`` and full information (the copy must not hold anything
the mover cannot see: a poker copy would read the cards), so `check_lookahead` refuses games
with chance deals. Cost: at most ``k + k * (k - 1)`` copies and steps for ``k`` legal moves.

Used by the ``tactical`` bot (`sparring.envs.bots.tactical.TacticalBot`) and by exploring
opponents (``exploration.league.tactical``), whose random moves then open new positions
without handing the learner a win it did not earn.
"""

from __future__ import annotations

from typing import Any


def _after(env: Any, action: str) -> Any:
    """A copy of ``env`` with ``action`` played."""
    twin = env.clone()
    twin.step(action)
    return twin


def _won(env: Any, seat: int) -> bool:
    """The game is over and ``seat``'s return is above every other seat's."""
    if env.current_seat() is not None:
        return False
    r = env.returns()
    return all(r[seat] > x for s, x in enumerate(r) if s != seat)


def wins_at_once(env: Any, seat: int, action: str) -> bool:
    """``action`` by ``seat`` (the mover) ends the game with ``seat``'s return above all
    others'."""
    return _won(_after(env, action), seat)


def tactical_actions(env: Any, seat: int, legal: list[str] | None = None) -> list[str]:
    """``seat``'s moves (from ``legal``, default ``env.legal_actions(seat)``) that win at
    once; else those that leave the next mover no win at once; else all of them."""
    legal = list(env.legal_actions(seat) if legal is None else legal)
    after = {a: _after(env, a) for a in legal}  # one copy per move
    wins = [a for a, twin in after.items() if _won(twin, seat)]
    if wins:
        return wins
    safe = [a for a, twin in after.items() if (nxt := twin.current_seat()) is None
            or not any(wins_at_once(twin, nxt, b) for b in twin.legal_actions(nxt) or [])]
    return safe or legal


def check_lookahead(env: Any) -> None:
    """Raise ValueError unless ``env`` can be searched by copies with nothing hidden."""
    if not callable(getattr(env, "clone", None)):
        raise ValueError(f"{env.name}: two-ply lookahead needs env.clone(), which it lacks")
    if callable(getattr(env, "deal_outcomes", None)):
        raise ValueError(f"{env.name} has hidden chance deals; a lookahead on a copy of its "
                         "state would read what the mover cannot see")
