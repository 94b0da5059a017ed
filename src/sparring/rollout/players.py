"""Who sits in a seat: a model (the training policy, a frozen checkpoint, another model)
or a bot.

* `ModelPlayer(policy, name, train, sampling, prompt, explore)`: ``policy`` is anything
  with a ``tokenizer`` and ``generate(prompts, sampling, allowed=None) -> list[Generation]``
  (`HFPolicy`, `VLLMPolicy`). ``train=True`` records the turn's token ids and log-probs
  (rows for the learner); ``train=False`` (frozen opponents) records the action text
  only, so `collate` makes no row for it. ``sampling``/``prompt``: per-player overrides
  of the arena's defaults. ``explore`` = epsilon: at each of its turns the player plays a
  uniformly random legal action with probability epsilon instead of its policy's (an
  epsilon-greedy player, seeded per turn by the arena; in a free-text env under
  constrained decoding, a uniformly random one of the env's action prefixes, the model
  writing the rest); ``explore_turns`` = N > 0 limits
  that to its first N turns of an episode; ``explore_tactical``: the random action is
  drawn among the moves a two-ply lookahead keeps (`sparring.envs.lookahead.
  tactical_actions`: a win if there is one, else no move that lets the next mover win at
  once). A frozen player's explored move is text, like a bot's. A training player's is a
  row for the learner: the move's tokens written in the arena's answer format, no sampler
  log-probs (``Turn.logprobs`` None), ``Turn.extras["explored"] = 1.0``. It is off-policy
  on purpose: the learner scores it with its own log-probs (``recompute_old_logp``), so
  its gradient is A * grad log pi(move) whatever pi(move) is, which lets a move the policy
  has all but stopped sampling win back probability when it pays (self-play collapsed
  onto one move, ``exploration.learner``); the rows are not reweighted by pi / behaviour
  probability, so the update is biased towards the explored moves while epsilon > 0.
* `BotPlayer(fn, name)`: ``fn(env, seat) -> action string`` (the games' bots); its turns
  are recorded as text with empty token ids.

`as_player` turns a bare policy or callable into a player.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sparring.envs.base import Env
from sparring.policy.sampling import Generation, SamplingParams
from sparring.rollout.prompts import PromptConfig

Bot = Callable[[Env, int], str]


class Policy(Protocol):
    tokenizer: Any

    def generate(self, prompts: list[list[int]], sampling: SamplingParams | None = None,
                 allowed: list[list[str] | None] | None = None) -> list[Generation]: ...


@dataclass(eq=False)
class ModelPlayer:
    policy: Policy
    name: str = "policy"
    train: bool = True
    sampling: SamplingParams | None = None
    prompt: PromptConfig | None = None
    explore: float = 0.0
    explore_turns: int = 0
    explore_tactical: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.explore <= 1.0:
            raise ValueError(f"ModelPlayer {self.name!r}: explore={self.explore}; must be in "
                             "[0, 1]")
        if self.explore_turns < 0:
            raise ValueError(f"ModelPlayer {self.name!r}: explore_turns={self.explore_turns}; "
                             "must be >= 0 (0: every turn)")


@dataclass(eq=False)
class BotPlayer:
    fn: Bot
    name: str = "bot"


Player = ModelPlayer | BotPlayer


def as_player(x: Any) -> Player:
    """A player from a player, a policy (object with ``generate``) or a bot callable."""
    if isinstance(x, ModelPlayer | BotPlayer):
        return x
    if hasattr(x, "generate") and hasattr(x, "tokenizer"):
        return ModelPlayer(x, name=str(getattr(x, "name", "policy")))
    if callable(x):
        return BotPlayer(x, name=getattr(x, "__name__", type(x).__name__))
    raise TypeError(f"cannot use {type(x).__name__} as a player: need a ModelPlayer, BotPlayer, "
                    "a policy with generate()/tokenizer, or a bot callable (env, seat) -> str")
