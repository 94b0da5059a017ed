"""The tactical bot: random, except that it never throws a game away in two plies."""

from __future__ import annotations

from typing import Any

from sparring.envs.bots.simple import Bot
from sparring.envs.lookahead import check_lookahead, tactical_actions


class TacticalBot(Bot):
    """Uniformly random among `tactical_actions`: takes a win in one, blocks the next
    mover's win in one, otherwise random (a weak baseline far from minimax: it sees no
    forks). Refuses games with hidden deals (`check_lookahead`)."""

    def act(self, env: Any, seat: int) -> str:
        check_lookahead(env)
        return self.rng.choice(tactical_actions(env, seat, self._legal(env, seat)))
