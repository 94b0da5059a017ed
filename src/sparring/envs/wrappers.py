"""Environment wrappers: try-again feedback, a (scheduled) turn budget, random openings
(the board views are `sparring.envs.views`).

All implement the `Env` protocol around an inner env and pass everything else through.

Truncation convention (all Sparring envs): an episode cut short by a step or turn limit
ends with ``StepResult(done=True, info={"truncated": True, ...})``; an episode that ended
by the rules (win, loss, answer, hole, ...) has no ``"truncated"`` key (or False).
Learners that bootstrap values must not treat a truncated end as terminal.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from sparring.envs.base import Env, ParseResult, StepResult, action_prefixes


class TryAgain:
    """Turn a single-seat verifiable task into a multi-turn one: on a wrong answer the agent
    sees feedback and answers again, up to ``attempts`` answers in all.

    An attempt is one inner episode; when it ends without success and attempts remain, the
    inner env is reset to the same seed (the same problem) and the next observation starts
    with ``"wrong (your answer: X). attempts left: n"``. Success is ``info["correct"]`` of
    the inner env's last step when present, else an inner return ``> 0``. The reward is
    paid when the wrapped episode ends: ``r = R_inner(last attempt) * discount**(attempt-1)``
    (``attempt`` counted from 1); earlier attempts pay 0. Multi-turn self-correction
    with feedback as in e.g. SCoRe (Kumar et al. 2024); the discount is our choice.
    """

    def __init__(self, env: Env, attempts: int = 3, discount: float = 1.0):
        if env.num_seats != 1:
            raise ValueError(f"TryAgain needs a single-seat env; {env.name} has {env.num_seats}")
        if attempts < 1:
            raise ValueError(f"TryAgain: attempts={attempts}; must be >= 1")
        if not 0.0 <= discount <= 1.0:
            raise ValueError(f"TryAgain: discount={discount}; must be in [0, 1]")
        self.env, self.attempts, self.discount = env, attempts, discount
        self.name, self.num_seats = f"try_again({env.name})", 1
        self.reset(0)

    def reset(self, seed: int) -> None:
        self.seed, self.attempt, self.feedback = seed, 1, ""
        self._done, self._ret = False, 0.0
        self.env.reset(seed)

    def current_seat(self) -> int | None:
        return None if self._done else self.env.current_seat()

    def system_prompt(self, seat: int) -> str:
        return (f"{self.env.system_prompt(seat)} You have {self.attempts} attempts; "
                "after a wrong answer you may try again.")

    def observation(self, seat: int) -> str:
        obs = self.env.observation(seat)
        return f"{self.feedback}\n{obs}" if self.feedback else obs

    def legal_actions(self, seat: int) -> list[str] | None:
        return self.env.legal_actions(seat)

    def action_prefixes(self, seat: int) -> list[str] | None:
        return action_prefixes(self.env, seat)

    def parse(self, seat: int, text: str) -> ParseResult:
        return self.env.parse(seat, text)

    def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError(f"{self.name}: step() after the episode ended; call reset(seed)")
        res = self.env.step(action)
        info = dict(res.info, attempt=self.attempt)
        if not res.done:
            return StepResult([0.0], False, info)
        inner = self.env.returns()[0]
        ok = bool(res.info["correct"]) if "correct" in res.info else inner > 0
        if ok or self.attempt >= self.attempts:
            self._done = True
            self._ret = inner * self.discount ** (self.attempt - 1)
            return StepResult([self._ret], True, info)
        info.pop("truncated", None)  # the inner attempt was cut, not the wrapped episode
        left = self.attempts - self.attempt
        self.feedback = f"wrong (your answer: {action[:60]}). attempts left: {left}"
        self.attempt += 1
        self.env.reset(self.seed)
        return StepResult([0.0], False, info)

    def state_key(self) -> str:
        return f"{self.env.state_key()}|attempt{self.attempt}"

    def returns(self) -> list[float]:
        return [self._ret]


Schedule = int | Callable[[int], int] | tuple[int, int, int]


class TurnBudget:
    """At most ``max_turns`` steps per episode; the step that reaches the budget while the
    inner episode goes on ends it with ``info["truncated"] = True`` (no extra reward).

    ``max_turns`` is an int, a callable ``step -> int``, or a linear schedule
    ``(start, end, steps)``: ``round(start + (end - start) * min(step, steps) / steps)``.
    `set_step` sets the training step; the budget it implies applies from the next
    `reset`. ``show=True`` appends ``"turns left: n"`` to observations. ``state_key()``
    is the inner env's (anchor states ignore the budget).
    """

    def __init__(self, env: Env, max_turns: Schedule, show: bool = False):
        if isinstance(max_turns, tuple):
            if len(max_turns) != 3 or max_turns[2] < 1:
                raise ValueError(f"TurnBudget: max_turns={max_turns}; a schedule is "
                                 "(start, end, steps) with steps >= 1")
        elif not callable(max_turns) and not isinstance(max_turns, int):
            raise ValueError(f"TurnBudget: max_turns={max_turns!r}; give an int, a callable "
                             "or (start, end, steps)")
        self.env, self.schedule, self.show = env, max_turns, show
        self.name, self.num_seats = env.name, env.num_seats
        self.train_step = 0
        self.reset(0)

    def budget(self, step: int) -> int:
        s = self.schedule
        if isinstance(s, tuple):
            start, end, steps = s
            value = round(start + (end - start) * min(max(step, 0), steps) / steps)
        else:
            value = s(step) if callable(s) else s
        if int(value) < 1:
            raise ValueError(f"TurnBudget: the budget at step {step} is {value}; must be >= 1")
        return int(value)

    def set_step(self, step: int) -> None:
        self.train_step = step

    def reset(self, seed: int) -> None:
        self.max_turns = self.budget(self.train_step)
        self.turns, self._cut = 0, False
        self.env.reset(seed)

    def current_seat(self) -> int | None:
        return None if self._cut else self.env.current_seat()

    def system_prompt(self, seat: int) -> str:
        return self.env.system_prompt(seat)

    def observation(self, seat: int) -> str:
        obs = self.env.observation(seat)
        return f"{obs}\nturns left: {self.max_turns - self.turns}" if self.show else obs

    def legal_actions(self, seat: int) -> list[str] | None:
        return self.env.legal_actions(seat)

    def action_prefixes(self, seat: int) -> list[str] | None:
        return action_prefixes(self.env, seat)

    def parse(self, seat: int, text: str) -> ParseResult:
        return self.env.parse(seat, text)

    def step(self, action: str) -> StepResult:
        if self._cut:
            raise RuntimeError(f"{self.name}: step() after the episode ended; call reset(seed)")
        res = self.env.step(action)
        self.turns += 1
        if not res.done and self.turns >= self.max_turns:
            self._cut = True
            return StepResult(res.rewards, True, dict(res.info, truncated=True))
        return res

    def state_key(self) -> str:
        return self.env.state_key()

    def returns(self) -> list[float]:
        return self.env.returns()


class RandomOpening:
    """Exploring starts: every episode begins ``n`` uniformly random legal moves into the
    game, ``n`` uniform in ``0..max_moves``, all drawn from the reset seed (episodes reset
    with one seed, e.g. a group's, start from one position). A move that would end the game
    is never drawn; the opening stops early when every legal move would. The opening's
    moves are nobody's turns and its rewards are dropped (for games that pay at the end:
    board games, Nim). Everything else is the inner env's, ``state_key()`` included, so a
    position reached by the opening is the same anchor state as when reached by play.
    Needs ``clone()`` and listed legal actions. Until the first `reset` it is the inner env
    as given, with no opening.

    ``listed``: openings given as move sequences (`sparring.envs.openings`, e.g. positions
    with a tactic to learn). With probability ``listed_share`` (drawn from the reset seed)
    an episode starts after one of them, drawn uniformly, instead of a random opening. Each
    must be legal and leave the game running from the start position of a reset:
    `check_openings` checks them once (the config checks do), and `play_opening` raises
    when a reset meets one that is not.

    ``replayed``: start positions as ``(reset seed, moves)`` pairs, e.g. where the learner
    went on to lose (`sparring.rollout.loss_replay`). With probability ``replayed_share``
    (drawn from the reset seed, before the other two) an episode starts from one of them,
    drawn uniformly: the inner env reset with that pair's seed (the cards of a card game,
    the views of `SymmetricViews`), then its moves.

    `start_record` is what it takes to replay an episode from any of its positions: the
    seed the inner env was reset with, every move since (the opening's included, as the
    inner env names them), the seat that made each and the state key before each.
    """

    def __init__(self, env: Env, max_moves: int, listed: Sequence[Sequence[str]] = (),
                 listed_share: float = 1.0,
                 replayed: Sequence[tuple[int, Sequence[str]]] = (),
                 replayed_share: float = 0.0):
        if not isinstance(max_moves, int) or isinstance(max_moves, bool) or max_moves < 0:
            raise ValueError(f"RandomOpening: max_moves={max_moves!r}; must be an int >= 0")
        for key, share in (("listed_share", listed_share), ("replayed_share", replayed_share)):
            if not 0.0 <= share <= 1.0:
                raise ValueError(f"RandomOpening: {key}={share!r}; must be in [0, 1]")
        if not hasattr(env, "clone"):
            raise ValueError(f"RandomOpening: {env.name} has no clone(); random openings "
                             "need it to keep the game from ending in the opening")
        seat = env.current_seat()
        if seat is not None and env.legal_actions(seat) is None:
            raise ValueError(f"RandomOpening: {env.name} lists no legal actions")
        self.env, self.max_moves = env, max_moves
        self.listed, self.listed_share = listed, listed_share
        self.replayed, self.replayed_share = replayed, replayed_share
        self.name, self.num_seats = env.name, env.num_seats
        # no opening until the first reset (an episode begins there: the training rollouts
        # make an env per episode and reset it at once, so an opening here would be waste)
        self._record(0)
        self.first_turn = 0

    def _record(self, seed: int) -> None:
        self.start_seed, self.source = seed, "random"
        self.moves: list[str] = []
        self.movers: list[int] = []
        self.keys: list[str] = []

    def reset(self, seed: int) -> None:
        self.env.reset(seed)
        self._record(seed)
        self._open(seed)
        self.first_turn = len(self.moves)  # moves before it are the opening's

    def _open(self, seed: int) -> None:
        """The opening drawn from ``seed``: a replayed start, a listed opening or random
        moves (class docstring), each move through `step`, which records it."""
        if self.replayed:
            pick = random.Random(f"replayed-start/{seed}")
            if pick.random() < self.replayed_share:
                self.start_seed, moves = self.replayed[pick.randrange(len(self.replayed))]
                self.env.reset(self.start_seed)
                self.source = "replayed"
                play_opening(self, moves, "replayed start")
                return
        if self.listed:
            pick = random.Random(f"listed-opening/{seed}")
            if pick.random() < self.listed_share:
                self.source = "listed"
                play_opening(self, self.listed[pick.randrange(len(self.listed))])
                return
        rng = random.Random(f"opening/{seed}")
        for _ in range(rng.randint(0, self.max_moves)):
            seat = self.env.current_seat()
            legal = self.env.legal_actions(seat) if seat is not None else []
            safe = [a for a in legal or [] if self._continues(a)]
            if not safe:
                break
            self.step(rng.choice(safe))

    @property
    def opening(self) -> list[str]:
        """The moves played before the first turn."""
        return self.moves[:self.first_turn]

    def start_record(self) -> dict[str, Any]:
        """This episode so far as `sparring.rollout.loss_replay` replays it (class docstring):
        ``{'seed', 'moves', 'movers', 'keys', 'opening', 'source'}``: ``opening`` the
        number of moves before the first turn, ``source`` where they came from ('random',
        'listed' or 'replayed')."""
        return {"seed": self.start_seed, "moves": list(self.moves),
                "movers": list(self.movers), "keys": list(self.keys),
                "opening": self.first_turn, "source": self.source}

    def _continues(self, action: str) -> bool:
        probe = self.env.clone()
        return not probe.step(action).done

    def current_seat(self) -> int | None:
        return self.env.current_seat()

    def system_prompt(self, seat: int) -> str:
        return self.env.system_prompt(seat)

    def observation(self, seat: int) -> str:
        return self.env.observation(seat)

    def legal_actions(self, seat: int) -> list[str] | None:
        return self.env.legal_actions(seat)

    def action_prefixes(self, seat: int) -> list[str] | None:
        return action_prefixes(self.env, seat)

    def parse(self, seat: int, text: str) -> ParseResult:
        return self.env.parse(seat, text)

    def step(self, action: str) -> StepResult:
        seat, key = self.env.current_seat(), self.env.state_key()
        result = self.env.step(action)
        if seat is not None:
            self.moves.append(action)
            self.movers.append(seat)
            self.keys.append(key)
        return result

    def state_key(self) -> str:
        return self.env.state_key()

    def returns(self) -> list[float]:
        return self.env.returns()

    def clone(self) -> Env:
        return self.env.clone()


def play_opening(env: Env, moves: Sequence[str], what: str = "listed opening") -> None:
    """``moves`` played on ``env`` from its current position; ValueError naming the first
    that is not legal there or ends the game. The message quotes only the game's own move
    names (those legal at a position met on the way): the moves may come from a file that
    is no openings file, whose text is not shown."""
    known: set[str] = set()
    for k, move in enumerate(moves):
        seat = env.current_seat()
        legal = (env.legal_actions(seat) if seat is not None else None) or []
        known.update(legal)
        where = f"after {' '.join(moves[:k])!r}" if k else "at the start"
        if move not in legal:
            said = f" ({move!r})" if move in known else " (no move of the game)"
            raise ValueError(f"{what}: move {k + 1}{said} is not legal {where} (legal: "
                             f"{' '.join(legal) or 'none'})")
        if env.step(move).done:
            raise ValueError(f"{what}: move {k + 1} ({move!r}) {where} ends the game; an "
                             "opening must leave a move to play")


def check_openings(env: Env, listed: Sequence[Sequence[str]]) -> None:
    """Every listed opening played from a reset of ``env`` (seed 0: for games whose start
    does not depend on the seed); ValueError naming the first bad one (`play_opening`)."""
    for i, moves in enumerate(listed):
        env.reset(0)
        play_opening(env, moves, f"opening {i + 1}")
    env.reset(0)


__all__ = ["RandomOpening", "TryAgain", "TurnBudget", "check_openings", "play_opening"]
