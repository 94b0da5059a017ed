"""PettingZoo environments through the Sparring protocol (optional extra: ``sparring[pettingzoo]``).

Any AEC environment (Terry et al. 2021), and any parallel one through PettingZoo's own
``parallel_to_aec``, given two small functions of yours::

    make("pettingzoo", env="classic/tictactoe-v3",
         obs_to_text=lambda obs: ...,          # an agent's observation -> text
         action_to_text=["a", "b", ...])       # a discrete action -> text (or a function)

* ``env``: an env object, a PettingZoo registry id (``"classic/connect_four-v3"``, built by
  ``pettingzoo.make``), ``"module:callable"``, or a module whose ``env()`` builds one (the
  older convention, ``"pettingzoo.classic.connect_four_v3"``); ``env_kwargs`` go to the
  builder. ``parallel=True`` builds the parallel version and converts it with PettingZoo's
  ``parallel_to_aec`` (a ``ParallelEnv`` object is converted too).
* Seats are ``possible_agents`` in order; ``current_seat()`` is ``agent_selection``'s seat,
  None once every agent is done (dead agents are stepped with ``None`` as the AEC API asks).
* ``observation(seat)``: ``obs_to_text(env.observe(agent))`` plus, with ``annotate=True``,
  a line saying whose turn it is and the legal moves (or the seat's return at the end).
* ``legal_actions(seat)``: for a ``Discrete`` action space, the texts of the actions the
  legal-action mask allows (``observation["action_mask"]``, else ``infos[agent]
  ["action_mask"]``, else every action); constrained decoding samples among them.
  ``action_to_text``: a function or a list of names (default ``str(action)``). Other
  action spaces are free text: ``text_to_action`` (a function) turns the answer into an
  action; an answer it rejects (or one outside the space) is unparsable / illegal.
* Rewards per step are ``env.rewards`` after the step (PettingZoo's instantaneous reward
  of every agent); ``info["truncated"]`` is set when the episode ends by truncation.
* ``state_key()``: a hash of ``env.state()`` when the env has one, else of the acting
  seat's observation text. ``clone()`` replays the episode's moves on a copy (for search
  bots such as minimax; deterministic given the seed).

Functions and the env may be given as ``"module:attr"`` strings, so a YAML config can name
them; `board_text` and the ``*_text`` / ``*_CELLS`` helpers below fit the classic board
games (``obs_to_text: sparring.envs.adapters.pettingzoo:tictactoe_text``).
"""

from __future__ import annotations

import copy
from typing import Any

from sparring.envs import register_env
from sparring.envs.adapters.gymnasium import (
    action_codec,
    check_codec,
    digest,
    discrete_actions,
    masked,
    parse_free,
)
from sparring.envs.base import ParseResult, StepResult
from sparring.envs.parsing import parse_choice
from sparring.extras import import_extra
from sparring.plugins import expose, import_object, reference


def import_pettingzoo() -> Any:
    return import_extra("pettingzoo", "pettingzoo", "the PettingZoo adapter")


def build_env(pz: Any, env: Any, env_kwargs: dict[str, Any] | None, parallel: bool) -> Any:
    """``env`` as given (an object); a registry id (``"classic/tictactoe-v3"``) through
    ``pettingzoo.make``; ``"module:callable"`` called; a module name: its ``env()`` (or
    ``parallel_env()`` with ``parallel``), all with ``**env_kwargs``."""
    kwargs = dict(env_kwargs or {})
    if not isinstance(env, str):
        if env is None:
            raise ValueError("pettingzoo: give env, e.g. env='classic/tictactoe-v3'")
        if kwargs:
            raise ValueError("pettingzoo: env_kwargs apply only when env is a name, not an object")
        return env
    if "/" in env and ":" not in env:
        if not hasattr(pz, "make"):
            raise ValueError(f"pettingzoo: registry ids such as {env!r} need pettingzoo>=1.27; "
                             "name the module instead (pettingzoo.classic.tictactoe_v3)")
        try:
            return pz.make("parallel" if parallel else "aec", env, **kwargs)
        except Exception as e:
            raise ValueError(f"pettingzoo: cannot make {env!r}: {e}") from None
    factory = "parallel_env" if parallel else "env"
    target = import_object(env if ":" in env else f"{env}:{factory}", "pettingzoo env")
    if not callable(target):
        raise ValueError(f"pettingzoo: {env!r} is not callable")
    return target(**kwargs)


class PettingZooEnv:
    """A PettingZoo AEC env as a Sparring `Env` (see the module doc)."""

    def __init__(self, env: Any, obs_to_text: Any, text_to_action: Any = None,
                 action_to_text: Any = None, *, env_kwargs: dict[str, Any] | None = None,
                 parallel: bool = False, system_prompt: str | None = None,
                 annotate: bool = True) -> None:
        pz = import_pettingzoo()
        env = build_env(pz, env, env_kwargs, parallel)
        if parallel or isinstance(env, pz.ParallelEnv):
            from pettingzoo.utils.conversions import parallel_to_aec

            env = parallel_to_aec(env)
        if not isinstance(env, pz.AECEnv):
            raise TypeError(f"pettingzoo: expected an AECEnv or a ParallelEnv, got "
                            f"{type(env).__name__}")
        self.env = env
        self.obs_to_text = import_object(obs_to_text, "pettingzoo obs_to_text")
        if not callable(self.obs_to_text):
            raise ValueError("pettingzoo: obs_to_text must be a function observation -> text")
        self.encode, self.decode = action_codec(action_to_text, text_to_action, "pettingzoo")
        self.agents = list(env.possible_agents)
        self.num_seats = len(self.agents)
        if self.num_seats < 1:
            raise ValueError("pettingzoo: the env has no possible_agents")
        meta = getattr(env, "metadata", None) or {}
        self.name = f"pettingzoo:{meta.get('name') or type(env.unwrapped).__name__}"
        self._system = system_prompt
        self.annotate = annotate
        self._spaces = {a: discrete_actions(env.action_space(a)) for a in self.agents}
        for agent, acts in self._spaces.items():
            if acts is None and self.decode is None:
                raise ValueError(f"pettingzoo: agent {agent!r} has action space "
                                 f"{env.action_space(agent)}, not Discrete: give text_to_action")
            check_codec(self.encode, self.decode, acts, f"pettingzoo agent {agent!r}")
        self.reset(0)

    # --- the protocol -----------------------------------------------------------------
    def reset(self, seed: int) -> None:
        self.seed = seed
        self.env.reset(seed=seed)
        self._ret = [0.0] * self.num_seats
        self._last_obs: dict[str, Any] = {}
        self._truncated = False
        self._moves: list[Any] = []  # the env actions since reset, for clone()
        self._skip_dead()

    def _skip_dead(self) -> None:
        """Step every dead agent out with ``None`` (the AEC API), until a live one acts."""
        env = self.env
        while env.agents and (env.terminations.get(env.agent_selection)
                              or env.truncations.get(env.agent_selection)):
            self._last_obs[env.agent_selection] = self._observe(env.agent_selection)
            env.step(None)

    def current_seat(self) -> int | None:
        if not self.env.agents:
            return None
        return self.agents.index(self.env.agent_selection)

    def _observe(self, agent: str) -> Any:
        try:
            obs = self.env.observe(agent)
        except Exception:  # an agent already removed: its last observation stands
            return self._last_obs.get(agent)
        self._last_obs[agent] = obs
        return obs

    def _legal_map(self, seat: int) -> dict[str, Any] | None:
        """Legal action text -> action for ``seat``; {} off turn, None for free text."""
        agent = self.agents[seat]
        acts = self._spaces[agent]
        if acts is None:
            return None
        if seat != self.current_seat():
            return {}
        acts = masked(acts, self._observe(agent), self.env.infos.get(agent))
        return {self.encode(a): a for a in acts}

    def _check_seat(self, seat: int) -> None:
        if not isinstance(seat, int) or not 0 <= seat < self.num_seats:
            raise ValueError(f"{self.name}: seat must be an int in [0, {self.num_seats}), "
                             f"got {seat!r}")

    def legal_actions(self, seat: int) -> list[str] | None:
        self._check_seat(seat)
        legal = self._legal_map(seat)
        return None if legal is None else list(legal)

    def system_prompt(self, seat: int) -> str:
        self._check_seat(seat)
        if self._system is not None:
            return self._system
        how = ("one of the legal actions" if self._spaces[self.agents[seat]] is not None
               else "your action")
        return (f"You are {self.agents[seat]} in {self.name.split(':', 1)[1]}. "
                f"Reply with {how} inside <answer>...</answer>.")

    def observation(self, seat: int) -> str:
        self._check_seat(seat)
        agent = self.agents[seat]
        text = str(self.obs_to_text(self._observe(agent)))
        if not self.annotate:
            return text
        now = self.current_seat()
        if now is None:
            return f"{text}\nYou are {agent}. Game over: you got {self._ret[seat]:+g}."
        if seat != now:
            return f"{text}\nYou are {agent}. Waiting for {self.agents[now]}."
        legal = self.legal_actions(seat)
        return f"{text}\nYou are {agent}." + (f" Legal: {' | '.join(legal)}" if legal else "")

    def parse(self, seat: int, text: object) -> ParseResult:
        try:
            self._check_seat(seat)
            legal = self._legal_map(seat)
        except Exception:
            return ParseResult("unparsable", error="not a seat of this game")
        if legal is not None:
            every = [self.encode(a) for a in self._spaces[self.agents[seat]] or []]
            return parse_choice(text, list(legal), every)
        if seat != self.current_seat():
            return ParseResult("illegal", error="it is not your turn")
        return parse_free(text, self.decode, self.env.action_space(self.agents[seat]))

    def step(self, action: str) -> StepResult:
        seat = self.current_seat()
        if seat is None:
            raise RuntimeError(f"{self.name}: step() after the episode ended; call reset(seed)")
        legal = self._legal_map(seat)
        if legal is not None and action not in legal:
            raise ValueError(f"{self.name}: illegal action {action!r} for seat {seat}; "
                             f"legal: {', '.join(legal) or '(none)'}")
        return self._apply(legal[action] if legal is not None else self.decode(action))

    def _apply(self, move: Any) -> StepResult:
        env = self.env
        env.step(move)
        self._moves.append(move)
        rewards = [float(env.rewards.get(a, 0.0)) for a in self.agents]
        ended = [a for a in env.agents if env.terminations.get(a) or env.truncations.get(a)]
        self._truncated = bool(ended) and all(env.truncations.get(a) and not
                                              env.terminations.get(a) for a in ended)
        self._ret = [r + d for r, d in zip(self._ret, rewards)]
        self._skip_dead()
        done = not env.agents
        return StepResult(rewards, done, {"truncated": True} if done and self._truncated else {})

    def state_key(self) -> str:
        try:
            return "state|" + digest(self.env.state())
        except (NotImplementedError, AttributeError):
            seat = self.current_seat()
            if seat is None:
                return "done"
            return f"{seat}|" + digest(self.observation(seat))

    def returns(self) -> list[float]:
        return list(self._ret)

    def clone(self) -> PettingZooEnv:
        """An independent copy in the same state, for search bots: a deep copy of the env,
        reset with this episode's seed, replaying its moves. (Deep-copying alone is not
        enough: PettingZoo's envs pickle through ``EzPickle``, which rebuilds them fresh.)"""
        new = copy.copy(self)
        new.env = copy.deepcopy(self.env)
        new.reset(self.seed)
        for move in self._moves:
            new._apply(move)
        return new


# --- text views of the classic board games ------------------------------------------------


@expose
def board_text(observation: Any, *, transpose: bool = False, marks: str = "XO.") -> str:
    """A board of two planes ``[rows, cols, 2]`` (the observer's pieces, the opponent's; the
    classic games' ``observation["observation"]``) as rows of ``marks``: mine, theirs, empty."""
    planes = observation["observation"] if isinstance(observation, dict) else observation
    if transpose:
        planes = planes.transpose(1, 0, 2)
    mine, theirs, empty = marks
    return "\n".join("".join(mine if cell[0] else theirs if cell[1] else empty for cell in row)
                     for row in planes)


@expose
def tictactoe_text(observation: Any) -> str:
    """PettingZoo tic-tac-toe: the board (X: you, O: the opponent), cells numbered 1-9 row by
    row (``TICTACTOE_CELLS`` names the actions so)."""
    return board_text(observation, transpose=True) + "\nX is you; cells 123/456/789."


@expose
def tictactoe_cells(observation: Any) -> str:
    """PettingZoo tic-tac-toe as its 9 cells row by row (``"X...O...."``; X: you), the
    compact view tiny models read best (with ``annotate=False``)."""
    return board_text(observation, transpose=True).replace("\n", "")


# PettingZoo numbers tic-tac-toe squares column by column (action a: row a % 3, column a // 3)
TICTACTOE_CELLS = expose([str(3 * (a % 3) + a // 3 + 1) for a in range(9)],
                         name="TICTACTOE_CELLS", module=__name__)


@expose
def connect_four_text(observation: Any) -> str:
    """PettingZoo Connect Four: the 6x7 grid, top row first (X: you, O: the opponent)."""
    return board_text(observation) + "\n1234567"


CONNECT_FOUR_COLUMNS = expose([str(c) for c in range(1, 8)], name="CONNECT_FOUR_COLUMNS",
                              module=__name__)


def pettingzoo_references(options: dict[str, Any]) -> dict[str, str]:
    """The code references these options hold, by option: the ``"module:attr"`` functions,
    and ``env`` unless it is a registry id (``"classic/tictactoe-v3"``, see `build_env`;
    a module name stands for its ``env()`` or ``parallel_env()``)."""
    out = {k: r for k in ("obs_to_text", "text_to_action", "action_to_text")
           if (r := reference(options.get(k)))}
    env = options.get("env")
    if isinstance(env, str) and (":" in env or "/" not in env):
        factory = "parallel_env" if options.get("parallel") else "env"
        out["env"] = env if ":" in env else f"{env}:{factory}"
    return out


@register_env("pettingzoo", family="game",
              source="PettingZoo (Terry et al. 2021) AEC/parallel envs, optional extra",
              needs=("pettingzoo extra",), references=pettingzoo_references)
def make_pettingzoo(env: Any = None, obs_to_text: Any = None, text_to_action: Any = None,
                    action_to_text: Any = None, **options: Any) -> PettingZooEnv:
    """Any PettingZoo env with your text functions (``"module:attr"`` names work)."""
    if obs_to_text is None:
        raise ValueError("pettingzoo: give obs_to_text, a function observation -> text, e.g. "
                         "obs_to_text='sparring.envs.adapters.pettingzoo:tictactoe_text'")
    return PettingZooEnv(env, obs_to_text, text_to_action, action_to_text, **options)
