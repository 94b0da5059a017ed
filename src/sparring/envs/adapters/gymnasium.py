"""Gymnasium environments through the Sparring protocol (optional extra: ``sparring[gymnasium]``).

A single-agent Gymnasium env (Towers et al. 2024) becomes a one-seat text task, given two
small functions of yours::

    make("gymnasium", env="FrozenLake-v1", env_kwargs={"is_slippery": False},
         obs_to_text=lambda s: f"you are on cell {s}",     # observation -> text
         action_to_text=["left", "down", "right", "up"])   # a discrete action -> text

* ``env``: an env object, or an id for ``gymnasium.make(env, **env_kwargs)`` (its
  ``"module:Env-v0"`` form imports the module first).
* ``legal_actions(0)``: for a ``Discrete`` action space, the texts of its actions (those
  an ``action_mask`` allows, from the observation dict or the step's info, when the env
  gives one); constrained decoding samples among them. ``action_to_text``: a list of names
  or a function (default ``str(action)``). Other spaces are free text: ``text_to_action``
  turns the answer into an action (an answer it rejects is unparsable, one outside the
  space illegal).
* ``step``: Gymnasium's ``(obs, reward, terminated, truncated, info)``; the episode ends on
  either flag, and ``info["truncated"]`` is True when it ended by truncation only.
* ``state_key()``: the observation itself when it is an int or a string (FrozenLake's
  cell), else a hash of its bytes.

The helpers `action_codec`, `discrete_actions` and `digest` serve the PettingZoo adapter
too (PettingZoo uses Gymnasium's spaces).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sparring.envs import register_env
from sparring.envs.base import ParseResult, StepResult
from sparring.envs.parsing import parse_choice, parse_tagged
from sparring.extras import import_extra
from sparring.plugins import import_module_named, import_object, reference


def import_gymnasium() -> Any:
    return import_extra("gymnasium", "gymnasium", "the Gymnasium adapter")


def action_codec(action_to_text: Any, text_to_action: Any, what: str
                 ) -> tuple[Callable[[Any], str], Callable[[str], Any] | None]:
    """(encode, decode): ``action_to_text`` a list of names (action ``i`` -> ``names[i]``) or
    a function (default ``str``); ``text_to_action`` a function or None. Either may be a
    ``"module:attr"`` string."""
    action_to_text = import_object(action_to_text, f"{what} action_to_text")
    decode = import_object(text_to_action, f"{what} text_to_action")
    if decode is not None and not callable(decode):
        raise ValueError(f"{what}: text_to_action must be a function, got {decode!r}")
    if action_to_text is None:
        return str, decode
    if isinstance(action_to_text, Sequence) and not isinstance(action_to_text, str):
        names = [str(n) for n in action_to_text]
        if len(set(names)) != len(names):
            raise ValueError(f"{what}: action_to_text names repeat: {names}")
        return (lambda a: names[int(a)]), decode
    if not callable(action_to_text):
        raise ValueError(f"{what}: action_to_text must be a function or a list of names, "
                         f"got {action_to_text!r}")
    return action_to_text, decode


def check_codec(encode: Callable[[Any], str], decode: Callable[[str], Any] | None,
                actions: list[int] | None, what: str) -> None:
    """With both directions given for a discrete space, they must be inverses."""
    if decode is None or actions is None:
        return
    for a in actions:
        back = decode(encode(a))
        if back != a:
            raise ValueError(f"{what}: text_to_action(action_to_text({a})) is {back!r}, not "
                             f"{a}; the two must be inverses")


def discrete_actions(space: Any) -> list[int] | None:
    """The actions of a Gymnasium ``Discrete`` space (``start .. start + n - 1``), else None."""
    from gymnasium.spaces import Discrete

    if not isinstance(space, Discrete):
        return None
    start = int(space.start)
    return list(range(start, start + int(space.n)))


def masked(actions: list[int], *sources: Any) -> list[int]:
    """``actions`` filtered by the first ``action_mask`` found in ``sources`` (dicts)."""
    for src in sources:
        mask = src.get("action_mask") if isinstance(src, dict) else None
        if mask is not None:
            return [a for i, a in enumerate(actions) if mask[i]]
    return actions


def digest(x: Any) -> str:
    """A short hash of an observation (its bytes for arrays, else its repr)."""
    data = x.tobytes() if hasattr(x, "tobytes") else repr(x).encode("utf-8", "replace")
    return hashlib.sha1(data).hexdigest()[:16]


def parse_free(text: object, decode: Callable[[str], Any], space: Any) -> ParseResult:
    """A free-text answer through ``decode``: unparsable when it raises, illegal outside
    ``space``."""
    res = parse_tagged(text)
    if not res.ok:
        return res
    try:
        action = decode(res.action)
    except Exception as e:
        return ParseResult("unparsable", error=f"cannot read an action from it: {e}")
    try:
        inside = bool(space.contains(action))
    except Exception:
        inside = False
    if not inside:
        return ParseResult("illegal", error=f"{res.action!r} is outside the action space")
    return res


class GymnasiumEnv:
    """A single-agent Gymnasium env as a one-seat Sparring `Env` (see the module doc)."""

    num_seats = 1

    def __init__(self, env: Any, obs_to_text: Any, text_to_action: Any = None,
                 action_to_text: Any = None, *, env_kwargs: dict[str, Any] | None = None,
                 system_prompt: str | None = None, annotate: bool = True) -> None:
        gym = import_gymnasium()
        if isinstance(env, str):
            if ":" in env:  # "module:Env-v0": gym.make would import the module
                import_module_named(env.partition(":")[0], "gymnasium env")
            try:
                env = gym.make(env, **dict(env_kwargs or {}))
            except gym.error.Error as e:
                raise ValueError(f"gymnasium: cannot make {env!r}: {e}") from None
        elif env is None:
            raise ValueError("gymnasium: give env, an env id such as 'FrozenLake-v1' or an env")
        elif env_kwargs:
            raise ValueError("gymnasium: env_kwargs apply only when env is an id, not an object")
        self.env = env
        self.obs_to_text = import_object(obs_to_text, "gymnasium obs_to_text")
        if not callable(self.obs_to_text):
            raise ValueError("gymnasium: obs_to_text must be a function observation -> text")
        self.encode, self.decode = action_codec(action_to_text, text_to_action, "gymnasium")
        self.actions = discrete_actions(env.action_space)
        if self.actions is None and self.decode is None:
            raise ValueError(f"gymnasium: action space {env.action_space} is not Discrete: "
                             "give text_to_action")
        check_codec(self.encode, self.decode, self.actions, "gymnasium")
        spec = getattr(env, "spec", None)
        self.name = f"gymnasium:{spec.id if spec is not None else type(env.unwrapped).__name__}"
        self._system = system_prompt
        self.annotate = annotate
        self.reset(0)

    def reset(self, seed: int) -> None:
        self.seed = seed
        self.obs, self.info = self.env.reset(seed=seed)
        self._done, self._ret = False, 0.0

    def current_seat(self) -> int | None:
        return None if self._done else 0

    def _check_seat(self, seat: int) -> None:
        if seat != 0:
            raise ValueError(f"{self.name}: a one-seat task; seat must be 0, got {seat!r}")

    def _legal_map(self) -> dict[str, Any] | None:
        if self.actions is None:
            return None
        if self._done:
            return {}
        return {self.encode(a): a for a in masked(self.actions, self.obs, self.info)}

    def legal_actions(self, seat: int) -> list[str] | None:
        self._check_seat(seat)
        legal = self._legal_map()
        return None if legal is None else list(legal)

    def system_prompt(self, seat: int) -> str:
        self._check_seat(seat)
        if self._system is not None:
            return self._system
        how = "one of the legal actions" if self.actions is not None else "your action"
        return (f"You act in {self.name.split(':', 1)[1]}. "
                f"Reply with {how} inside <answer>...</answer>.")

    def observation(self, seat: int) -> str:
        self._check_seat(seat)
        text = str(self.obs_to_text(self.obs))
        if not self.annotate:
            return text
        if self._done:
            return f"{text}\nEpisode over: return {self._ret:+g}."
        legal = self.legal_actions(seat)
        return f"{text}\nLegal: {' | '.join(legal)}" if legal else text

    def parse(self, seat: int, text: object) -> ParseResult:
        if seat != 0 or self._done:
            return ParseResult("unparsable", error="not your turn")
        legal = self._legal_map()
        if legal is not None:
            return parse_choice(text, list(legal), [self.encode(a) for a in self.actions or []])
        return parse_free(text, self.decode, self.env.action_space)

    def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError(f"{self.name}: step() after the episode ended; call reset(seed)")
        legal = self._legal_map()
        if legal is not None and action not in legal:
            raise ValueError(f"{self.name}: illegal action {action!r}; legal: "
                             f"{', '.join(legal)}")
        act = legal[action] if legal is not None else self.decode(action)
        self.obs, reward, terminated, truncated, self.info = self.env.step(act)
        self._done = bool(terminated or truncated)
        self._ret += float(reward)
        info = dict(self.info or {})
        if truncated and not terminated:
            info["truncated"] = True
        return StepResult([float(reward)], self._done, info)

    def state_key(self) -> str:
        obs = self.obs
        if isinstance(obs, str):
            return obs
        if isinstance(obs, int | np.integer):
            return str(int(obs))
        return digest(obs)

    def returns(self) -> list[float]:
        return [self._ret]


def gymnasium_references(options: dict[str, Any]) -> dict[str, str]:
    """The code references these options hold, by option: the ``"module:attr"`` functions,
    and an env id in Gymnasium's ``"module:EnvName-v0"`` form (``gym.make`` imports it)."""
    keys = ("env", "obs_to_text", "text_to_action", "action_to_text")
    return {k: r for k in keys if (r := reference(options.get(k)))}


@register_env("gymnasium", family="task",
              source="Gymnasium (Towers et al. 2024) single-agent envs, optional extra",
              needs=("gymnasium extra",), references=gymnasium_references)
def make_gymnasium(env: Any = None, obs_to_text: Any = None, text_to_action: Any = None,
                   action_to_text: Any = None, **options: Any) -> GymnasiumEnv:
    """Any single-agent Gymnasium env with your text functions (``"module:attr"`` names work)."""
    if obs_to_text is None:
        raise ValueError("gymnasium: give obs_to_text, a function observation -> text")
    return GymnasiumEnv(env, obs_to_text, text_to_action, action_to_text, **options)
