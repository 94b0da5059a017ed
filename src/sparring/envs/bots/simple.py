"""The bot base class and the uniform random bot."""

from __future__ import annotations

import random
from typing import Any


class Bot:
    """A player with its own seeded RNG. Subclasses implement ``act(env, seat)``."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def act(self, env: Any, seat: int) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, env: Any, seat: int) -> str:
        return self.act(env, seat)

    @staticmethod
    def _legal(env: Any, seat: int) -> list[str]:
        legal = env.legal_actions(seat)
        if legal is None:
            raise TypeError(f"{type(env).__name__} takes free text; bots need a finite legal set")
        if not legal:
            raise ValueError(f"{env.name}: seat {seat} has no legal action now")
        return legal


class RandomBot(Bot):
    """Uniformly random legal action."""

    def act(self, env: Any, seat: int) -> str:
        return self.rng.choice(self._legal(env, seat))
