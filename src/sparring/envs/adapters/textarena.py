"""TextArena games through the Sparring protocol (optional extra: ``sparring[textarena]``).

``make("textarena", env_id="TicTacToe-v0", num_players=2)`` wraps ``textarena.make(env_id)``
(ids ending in ``-raw`` skip TextArena's observation wrappers, so prompts come apart).
TextArena (Guertler et al. 2025) drives a game with ``reset(num_players, seed)``,
``get_observation() -> (player_id, messages)`` (it hands each player its messages once),
``step(text) -> (done, info)`` and ``close() -> (rewards, game_info)``. The mapping:

* ``current_seat()``: the player id of the last ``get_observation``; None once done.
* ``system_prompt(seat)``: the seat's PROMPT messages (TextArena's player prompt).
* ``observation(seat)``: the seat's other messages as ``"[sender] text"`` lines, all of
  them (``history="full"``) or those since the seat last acted (``"last"``; they start
  with TextArena's echo of that move). Wrapped
  TextArena envs that return one string already hold the history; it is used as is.
* ``legal_actions`` is None (free text); ``parse`` takes the answer tag or the stripped
  text; TextArena judges moves itself (its invalid-move rules apply).
* Rewards are 0 until the end, then TextArena's per-player rewards.
* ``state_key()``: a hash of the acting seat and everything it has seen (TextArena has no
  state key of its own). TextArena seeds Python's global ``random`` in ``reset``.

textarena is imported only when an env is built; without it the error names the extra.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sparring.envs import register_env
from sparring.envs.base import ParseResult, StepResult
from sparring.envs.parsing import parse_tagged
from sparring.extras import import_extra

GAME_ID = -1


def import_textarena() -> Any:
    return import_extra("textarena", "textarena", "the TextArena adapter")


def _kind(obs_type: Any) -> str:
    return str(getattr(obs_type, "name", obs_type)).upper()


class TextArenaEnv:
    """A TextArena env (built from ``env_id``, or passed as ``env``) as a Sparring `Env`."""

    def __init__(self, env_id: str | None = None, num_players: int = 2, history: str = "full",
                 env: Any = None):
        if history not in ("full", "last"):
            raise ValueError(f"textarena: history={history!r}; allowed: full, last")
        if num_players < 1:
            raise ValueError(f"textarena: num_players={num_players}; must be >= 1")
        if env is None:
            if not env_id:
                raise ValueError("textarena: give env_id, e.g. env_id='TicTacToe-v0'")
            env = import_textarena().make(env_id)
        self.env, self.history = env, history
        self.name, self.num_seats = f"textarena:{env_id or type(env).__name__}", num_players
        self.reset(0)

    # --- TextArena -> our buffers ---------------------------------------------------
    def _sender(self, pid: int) -> str:
        if pid == GAME_ID:
            return "GAME"
        roles = getattr(getattr(self.env, "state", None), "role_mapping", None) or {}
        return str(roles.get(pid, f"Player {pid}"))

    def _absorb(self, seat: int, obs: Any) -> None:
        if isinstance(obs, str):  # a wrapped env: the whole history as one string
            self._text[seat], self._wrapped = [obs], True
            return
        for msg in obs or []:
            sender, text = msg[0], str(msg[1])
            kind = _kind(msg[2]) if len(msg) > 2 else ""
            if kind == "PROMPT":
                self._prompt[seat].append(text)
            else:
                self._text[seat].append(f"[{self._sender(sender)}] {text}")

    def _pull(self) -> None:
        seat, obs = self.env.get_observation()
        if not 0 <= int(seat) < self.num_seats:
            raise RuntimeError(f"textarena: player id {seat} outside 0..{self.num_seats - 1}")
        self._seat = int(seat)
        self._absorb(self._seat, obs)

    # --- the protocol ---------------------------------------------------------------
    def reset(self, seed: int) -> None:
        self.env.reset(num_players=self.num_seats, seed=seed)
        n = self.num_seats
        self._text: list[list[str]] = [[] for _ in range(n)]
        self._prompt: list[list[str]] = [[] for _ in range(n)]
        self._mark = [0] * n  # where each seat's "last" history starts
        self._done, self._ret, self._wrapped = False, [0.0] * n, False
        self._pull()

    def current_seat(self) -> int | None:
        return None if self._done else self._seat

    def system_prompt(self, seat: int) -> str:
        return "\n".join(self._prompt[seat]) or "Play the game. Reply with your move."

    def observation(self, seat: int) -> str:
        lines = self._text[seat]
        if self.history == "last" and not self._wrapped:
            lines = lines[self._mark[seat]:]
        return "\n".join(lines)

    def legal_actions(self, seat: int) -> list[str] | None:
        return None

    def parse(self, seat: int, text: str) -> ParseResult:
        if seat != self.current_seat():
            return ParseResult("illegal", error="it is not your turn")
        return parse_tagged(text)

    def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError(f"{self.name}: step() after the episode ended; call reset(seed)")
        seat = self._seat
        done, info = self.env.step(action)
        self._mark[seat] = len(self._text[seat])
        info = dict(info or {})
        if not done:
            self._pull()
            return StepResult([0.0] * self.num_seats, False, info)
        closed = self.env.close()
        rewards, game_info = closed if isinstance(closed, tuple) else (closed, None)
        self._ret = [float((rewards or {}).get(i, 0.0)) for i in range(self.num_seats)]
        self._done = True
        if game_info is not None:
            info["game_info"] = game_info
        return StepResult(list(self._ret), True, info)

    def state_key(self) -> str:
        seat = self.current_seat()
        seen = "\n".join(self._text[seat]) if seat is not None else "done"
        return f"{seat}|" + hashlib.sha1(seen.encode("utf-8", "replace")).hexdigest()[:16]

    def returns(self) -> list[float]:
        return list(self._ret)


@register_env("textarena", family="game", source="TextArena (Guertler et al. 2025)",
              needs=("textarena extra",))
def make_textarena(**options: Any) -> TextArenaEnv:
    return TextArenaEnv(**options)
