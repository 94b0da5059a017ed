"""OpenSpiel games through the Sparring protocol: ``make("openspiel", game="tic_tac_toe")``.

Any sequential (turn-based) OpenSpiel game with any number of players. Observations are
the seat's information-state string (or observation string) plus the legal moves;
actions are OpenSpiel's ``action_to_string`` texts; chance nodes are sampled from a
``random.Random(seed)`` so ``reset(seed)`` is deterministic. Rewards per step are the
change of OpenSpiel's ``returns()``. Needs the ``openspiel`` extra (imported lazily).
"""

from __future__ import annotations

import random
from typing import Any

from sparring.envs import register_env
from sparring.envs.base import ParseResult, StepResult
from sparring.envs.parsing import parse_choice
from sparring.extras import import_extra


def _pyspiel():
    return import_extra("pyspiel", "openspiel", "the OpenSpiel adapter")


class OpenSpielEnv:
    def __init__(self, game: str, params: dict[str, Any] | None = None) -> None:
        pyspiel = _pyspiel()
        try:
            self.game = pyspiel.load_game(game, dict(params or {}))
        except pyspiel.SpielError as e:
            raise ValueError(f"openspiel: cannot load game {game!r} with {params!r}: {e}") from None
        gt = self.game.get_type()
        if gt.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
            raise ValueError(f"openspiel: {game!r} is not turn-based; only sequential games are supported")
        self.name = f"openspiel:{game}"
        self.num_seats = self.game.num_players()
        self._info = gt.provides_information_state_string
        self._obs = gt.provides_observation_string
        self._short = game
        # what search bots by copies of the state may play (`sparring.envs.bots.NEEDS`)
        self.perfect_information = \
            gt.information == pyspiel.GameType.Information.PERFECT_INFORMATION
        self.reset(0)

    def reset(self, seed: int = 0) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.state = self.game.new_initial_state()
        self._resolve_chance()
        self._last = [0.0] * self.num_seats

    def _resolve_chance(self) -> None:
        st = self.state
        while st.is_chance_node():
            outcomes = st.chance_outcomes()
            a = self.rng.choices([o for o, _ in outcomes], weights=[p for _, p in outcomes])[0]
            st.apply_action(a)

    def current_seat(self) -> int | None:
        return None if self.state.is_terminal() else self.state.current_player()

    def _legal_map(self, seat: int) -> dict[str, int]:
        if seat != self.current_seat():
            return {}
        out: dict[str, int] = {}
        for a in self.state.legal_actions(seat):
            s = self.state.action_to_string(seat, a)
            out[s if s not in out else f"{s}#{a}"] = a
        return out

    def legal_actions(self, seat: int) -> list[str]:
        return list(self._legal_map(seat))

    def system_prompt(self, seat: int) -> str:
        return (f"You play the game {self._short} as player {seat} of {self.num_seats}. "
                "Reply with one of the legal moves inside <answer>...</answer>.")

    def info_state(self, seat: int) -> str:
        if self._info:
            return self.state.information_state_string(seat)
        if self._obs:
            return self.state.observation_string(seat)
        return str(self.state)

    def observation(self, seat: int) -> str:
        if not 0 <= seat < self.num_seats:
            raise ValueError(f"{self.name}: seat must be in [0, {self.num_seats}), got {seat!r}")
        view = self.info_state(seat)
        if self.state.is_terminal():
            return f"{view}\nYou are player {seat}. Game over: you got {self.returns()[seat]:+g}."
        if seat != self.current_seat():
            return f"{view}\nYou are player {seat}. Waiting for player {self.current_seat()}."
        return f"{view}\nYou are player {seat}. Legal: {' | '.join(self.legal_actions(seat))}"

    def parse(self, seat: int, text: object) -> ParseResult:
        try:
            legal = self.legal_actions(seat)
        except Exception:
            legal = []
        return parse_choice(text, legal)

    def step(self, action: str) -> StepResult:
        seat = self.current_seat()
        legal = self._legal_map(seat) if seat is not None else {}
        if action not in legal:
            raise ValueError(f"{self.name}: illegal action {action!r} for seat {seat}; "
                             f"legal: {', '.join(legal) or '(game over)'}")
        self.state.apply_action(legal[action])
        self._resolve_chance()
        now = self.returns()
        rewards = [a - b for a, b in zip(now, self._last)]
        self._last = now
        return StepResult(rewards, self.state.is_terminal(), {})

    def state_key(self) -> str:
        return f"{self.state.current_player()}|{self.state}"

    def returns(self) -> list[float]:
        return [float(r) for r in self.state.returns()]

    def clone(self) -> OpenSpielEnv:
        new = object.__new__(OpenSpielEnv)
        new.__dict__.update(self.__dict__)
        new.state = self.state.clone()
        new.rng = random.Random()
        new.rng.setstate(self.rng.getstate())
        new._last = list(self._last)
        return new


@register_env("openspiel", family="game", source="OpenSpiel (Lanctot et al., 2019), optional extra")
def make_openspiel(game: str = "tic_tac_toe", params: dict[str, Any] | None = None) -> OpenSpielEnv:
    """Any turn-based OpenSpiel game; ``game``: its short name, ``params``: its parameters."""
    return OpenSpielEnv(game, params)
