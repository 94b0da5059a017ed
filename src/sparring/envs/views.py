"""A game played through views of its board: each seat's own symmetry of it
(`SymmetricViews`, a training-time augmentation) or its canonical orientation
(`CanonicalViews`, part of the game's observation). Both implement the `Env` protocol
around a game that declares its symmetries, as the wrappers of `sparring.envs.wrappers` do.
"""

from __future__ import annotations

import random
from typing import Any

from sparring.envs.base import Env, ParseResult, StepResult
from sparring.envs.parsing import parse_choice
from sparring.memo import BoundedMemo


class _Viewed:
    """A game played through views of its board: seat ``s`` sees
    ``env.observation(s, view=self.view(s))``, names its moves in that view, and they are
    mapped back to the board (``env.board_action``); rewards and returns are the game's.
    Subclasses say which view a seat has (`view`).

    Needs a game that declares its symmetries: ``symmetries() -> int`` (view 0 the
    identity), ``observation(seat, view)``, ``view_action(action, view)`` (board -> view)
    and ``board_action(action, view)`` (view -> board), as tic-tac-toe and Connect Four do.
    """

    def __init__(self, env: Env):
        needs = ("symmetries", "view_action", "board_action", "ALL_ACTIONS")
        missing = [m for m in needs if not hasattr(env, m)]
        if missing:
            raise ValueError(f"{type(self).__name__}: {env.name} declares no symmetries (no "
                             f"{', '.join(missing)})")
        self.env, self.name, self.num_seats = env, env.name, env.num_seats
        self.ALL_ACTIONS = env.ALL_ACTIONS

    def view(self, seat: int) -> int:
        raise NotImplementedError

    def current_seat(self) -> int | None:
        return self.env.current_seat()

    def system_prompt(self, seat: int) -> str:
        return self.env.system_prompt(seat)

    def observation(self, seat: int) -> str:
        return self.env.observation(seat, view=self.view(seat))

    def legal_actions(self, seat: int) -> list[str] | None:
        return self._legal_in_view(seat, self.view(seat))

    def _legal_in_view(self, seat: int, view: int) -> list[str] | None:
        """``seat``'s legal moves named in view ``view``, sorted (None: the game lists none)."""
        legal = self.env.legal_actions(seat)
        return None if legal is None else sorted(self.env.view_action(a, view) for a in legal)

    def parse(self, seat: int, text: str) -> ParseResult:
        """The move named in ``seat``'s view (`step` maps it to the board)."""
        return parse_choice(text, self.legal_actions(seat) or [], list(self.ALL_ACTIONS))

    def step(self, action: str) -> StepResult:
        seat = self.env.current_seat()
        if seat is None or action not in self.ALL_ACTIONS:
            return self.env.step(action)  # the inner game's own error
        return self.env.step(self.env.board_action(action, self.view(seat)))

    def returns(self) -> list[float]:
        return self.env.returns()

    def clone(self) -> _Viewed:
        twin = object.__new__(type(self))  # what copy.copy makes, without its lookups
        twin.__dict__ = {**self.__dict__, "env": self.env.clone()}
        return twin


class SymmetricViews(_Viewed):
    """Each seat plays the game through its own symmetry of the board, drawn uniformly at
    `reset` from the reset seed (episodes reset with one seed, e.g. a group's, share their
    views). The game itself, its rewards and its value are unchanged; what changes is that
    a line one seat knows is met by the other in every orientation, where plain self-play
    repeats it in one. Needs what `_Viewed` needs. ``state_key()`` is the inner key with
    the mover's view (``"...|view3"``): anchor states stay states whose observations are
    identical.
    """

    def __init__(self, env: Env):
        super().__init__(env)
        self.reset(0)

    def reset(self, seed: int) -> None:
        self.env.reset(seed)
        rng = random.Random(f"views/{seed}")
        self.views = [rng.randrange(self.env.symmetries()) for _ in range(self.num_seats)]

    def view(self, seat: int) -> int:
        return self.views[seat]

    def state_key(self) -> str:
        seat = self.env.current_seat()
        key = self.env.state_key()
        return key if seat is None else f"{key}|view{self.views[seat]}"

    def clone(self) -> SymmetricViews:
        twin = super().clone()
        twin.views = list(self.views)
        return twin


VIEW_MEMO_SIZE = 1 << 16  # positions a memo of canonical views holds before it empties
_VIEW_MEMOS: dict[tuple[Any, ...], BoundedMemo] = {}


def shared_view_memo(key: tuple[Any, ...]) -> BoundedMemo:
    """The memo of canonical views shared by every `CanonicalViews` made with ``key`` (a
    game's name and the options that change how its observations are written)."""
    memo = _VIEW_MEMOS.get(key)
    if memo is None:
        memo = _VIEW_MEMOS[key] = BoundedMemo(VIEW_MEMO_SIZE)
    return memo


class CanonicalViews(_Viewed):
    """Every seat sees the board in its canonical orientation: of the game's symmetries, the
    view whose observation text sorts first (the lowest view index on ties), recomputed at
    every position. Positions that are symmetric to each other then read the same, so what
    the policy learns in one holds in all of them (a tic-tac-toe corner opening is one
    position, not four). Unlike `SymmetricViews`, a training-time augmentation, this is
    part of the game's observation: evaluation and bots play the same wrapped game (it is
    the game option ``canonical``). Rewards, values and ``state_key()`` are the inner
    game's. Needs what `_Viewed` needs.

    ``memo``: ``{(state_key, seat): (view, observation, legal moves in the view)}``, to
    share between the wrappers of games whose observations are written alike (a game's
    factory passes `shared_view_memo` of its option set): a view costs one observation per
    symmetry, and a rollout's episodes meet the same positions again and again, each
    asking for the observation and the legal moves more than once.
    """

    def __init__(self, env: Env, memo: BoundedMemo | None = None):
        super().__init__(env)
        self.memo = BoundedMemo(VIEW_MEMO_SIZE) if memo is None else memo

    def view(self, seat: int) -> int:
        """``seat``'s canonical view of the current position (the position read from
        ``state_key()``, which the Env contract makes fix the observations)."""
        return self._canonical(seat)[0]

    def observation(self, seat: int) -> str:
        return self._canonical(seat)[1]

    def legal_actions(self, seat: int) -> list[str] | None:
        legal = self._canonical(seat)[2]
        return None if legal is None else list(legal)

    def _canonical(self, seat: int) -> tuple[int, str, tuple[str, ...] | None]:
        return self.memo.get_or((self.env.state_key(), seat), lambda: self._smallest(seat))

    def _smallest(self, seat: int) -> tuple[int, str, tuple[str, ...] | None]:
        """The view whose text sorts first, that text, and the legal moves named in it."""
        texts = [self.env.observation(seat, view=v) for v in range(self.env.symmetries())]
        view = min(range(len(texts)), key=lambda v: (texts[v], v))
        legal = self._legal_in_view(seat, view)
        return view, texts[view], None if legal is None else tuple(legal)

    def reset(self, seed: int) -> None:
        self.env.reset(seed)

    def state_key(self) -> str:
        return self.env.state_key()


__all__ = ["CanonicalViews", "SymmetricViews", "shared_view_memo"]
