"""The environment protocol: text in, text out, any number of seats, per-seat rewards.

An environment never sees tokens and never raises on model output: `parse` classifies a
raw model text as a legal action, an illegal one or an unparsable one, and `step` takes
only legal actions (the rollout applies the invalid-action policy in between).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

ParseStatus = Literal["legal", "illegal", "unparsable"]


@dataclass(frozen=True)
class ParseResult:
    """What a raw model text means: ``action`` is the canonical legal action string when
    ``status == "legal"``; ``error`` is a short message that can be shown to the agent."""

    status: ParseStatus
    action: str | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "legal"


@dataclass
class StepResult:
    """Rewards for every seat (index = seat) earned by this step; ``done`` ends the episode."""

    rewards: list[float]
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    name: str
    num_seats: int

    def reset(self, seed: int) -> None: ...

    def current_seat(self) -> int | None:  # None when the episode is over
        ...

    def system_prompt(self, seat: int) -> str:  # rules, role and the answer format
        ...

    def observation(self, seat: int) -> str:  # what that seat may see
        ...

    def legal_actions(self, seat: int) -> list[str] | None:  # None = free text
        ...

    def parse(self, seat: int, text: str) -> ParseResult:  # never raises
        ...

    def step(self, action: str) -> StepResult:  # a legal action of current_seat()
        ...

    def state_key(self) -> str:  # hashable state, for anchor-state grouping
        ...

    def returns(self) -> list[float]:  # cumulative reward per seat so far
        ...

    # Optional, for free-text envs: ``action_prefixes(seat) -> list[str] | None``, the ways a
    # move may begin (e.g. ["calc:", "answer:"]); see `action_prefixes`.
    # Optional, for tasks: ``outcome_keys: tuple[str, ...]``, the numbers the step that ends an
    # episode puts in its info (e.g. ("correct", "calls")); the task evaluation reports each,
    # 0 for an episode that forfeits, even when every episode does.


def action_prefixes(env: Env, seat: int) -> list[str] | None:
    """The strings one of which a move of ``seat`` must begin with, for an env whose moves
    are free text (``legal_actions`` None) but start with a command word: under
    ``rollout.invalid_action=constrained`` the sampler spells one of them and decodes the
    rest freely. None when the env declares none (a method ``action_prefixes`` is optional)."""
    fn = getattr(env, "action_prefixes", None)
    return None if fn is None else fn(seat)


@runtime_checkable
class TreeGame(Env, Protocol):
    """A small imperfect-information game whose exact tree can be walked (Kuhn, Leduc):
    declared with ``register_env(..., game_tree=True)``; exploitability and CFR use it."""

    def deal_outcomes(self) -> list[tuple[int, ...]]:  # every chance deal, equally likely
        ...

    def reset_deal(self, deal: tuple[int, ...]) -> None:  # start a hand with this deal
        ...

    def info_state(self, seat: int) -> str:  # what the seat knows, as a string key
        ...

    def clone(self) -> TreeGame:
        ...

    def tree_options(self) -> dict[str, Any]:  # the options that rebuild this game's tree
        ...
