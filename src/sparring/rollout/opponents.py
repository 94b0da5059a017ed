"""Opponent pool (a league): fixed bots and past checkpoints of the learner.

Sampling weights over the pool's entries (bots first, then checkpoints oldest to newest):

* ``uniform``: every entry weight 1.
* ``recency``: bots weight 1; the checkpoint of age ``a`` (0 = newest) weight
  ``decay ** a``, so recent checkpoints are met more often.
* ``pfsp``: prioritised fictitious self-play (AlphaStar, Vinyals et al. 2019): entry ``i``
  weight ``(1 - x_i) ** power``, ``x_i`` the learner's recent score against it, so the
  opponents it still loses to are met most and those it always beats (a random bot, old
  snapshots) almost never; every entry uniform while all weights are 0. AlphaStar's
  ``f_hard(x) = (1 - x)^p`` is over win probabilities; ours scores a draw 1/2 (our
  reading for games with draws).

Scores (every mode keeps them; `record`): a game against entry ``i`` scores 1 if the
learner's game return beats the entry's, 1/2 if equal, 0 if below; after each step
``x_i <- x_i + score_rate * (mean score of the step's games - x_i)``, ``x_i = 1/2``
before its first game (an exponential average: the learner changes, old games go stale).

Probabilities are the weights normalised. ``max_checkpoints`` keeps only the newest
ones (a dropped one also leaves the cache). Checkpoints are folders loaded on demand by ``loader(path) -> policy`` (default
`HFPolicy.from_pretrained`; the path is passed as recorded, so a run's rollouts record
paths relative to the run folder and their loader resolves them there, see
`sparring.rollout.snapshots`), keeping the ``cache_size`` most recently used in memory (each
one that leaves the cache, evicted or dropped from the pool, goes to ``unloader(path,
player)`` when given: a snapshot adapter is deleted from its model there), and
play as ``ModelPlayer(train=False, explore=explore, explore_turns=explore_turns)`` (their
turns are context, not training rows; ``explore`` = epsilon: each of their moves, or of their
first ``explore_turns`` moves, is uniformly random with probability epsilon, among the
moves a two-ply lookahead keeps with ``explore_tactical``; `set_explore`
changes it, for a schedule).
`state_dict` / `load_state_dict` save the checkpoint list, the scores and the sampler's RNG
state (plain JSON); bots are code, so the restoring side adds the same bots first (names
are checked).

``players_fn(learner, num_seats)`` gives an ``Arena.run_episodes(players_fn=...)`` chooser: the
learner sits in seat ``i % num_seats`` of episode ``i`` and the other seats get sampled
opponents.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sparring.policy.sampling import SamplingParams
from sparring.rollout.players import Bot, BotPlayer, ModelPlayer, Player, as_player
from sparring.rollout.seating import rotating

MODES = ("uniform", "recency", "pfsp")
PRIOR_SCORE = 0.5  # an entry's score before its first game


@dataclass
class _Checkpoint:
    path: str
    step: int
    name: str


class OpponentPool:
    def __init__(self, mode: str = "uniform", decay: float = 0.7, max_checkpoints: int = 0,
                 seed: int = 0, loader: Callable[[str], Any] | None = None, cache_size: int = 2,
                 unloader: Callable[[str, Player], None] | None = None,
                 explore: float = 0.0, explore_turns: int = 0, explore_tactical: bool = False,
                 sampling: SamplingParams | None = None, power: float = 2.0,
                 score_rate: float = 0.5):
        if mode not in MODES:
            raise ValueError(f"opponents.mode={mode!r}; allowed: {', '.join(MODES)}")
        if not 0 < decay <= 1:
            raise ValueError(f"opponents.decay={decay}; must be in (0, 1]")
        if max_checkpoints < 0 or cache_size < 1:
            raise ValueError("opponents.max_checkpoints must be >= 0 and cache_size >= 1")
        if power <= 0 or not 0 < score_rate <= 1:
            raise ValueError(f"opponents: power={power} must be > 0 and score_rate={score_rate} "
                             "in (0, 1]")
        self.mode, self.decay, self.max_checkpoints = mode, decay, max_checkpoints
        self.power, self.score_rate = power, score_rate
        self.scores: dict[str, float] = {}  # entry name -> the learner's recent score
        self.rng = random.Random(seed)
        self.loader = loader or _load_hf
        self.unloader = unloader
        self.cache_size = cache_size
        self.explore, self.explore_turns = explore, explore_turns
        self.explore_tactical = explore_tactical
        self.sampling = sampling  # the snapshots' own sampling (None: the arena's)
        self.bots: list[BotPlayer] = []
        self.checkpoints: list[_Checkpoint] = []
        self._cache: OrderedDict[str, ModelPlayer] = OrderedDict()

    def __len__(self) -> int:
        return len(self.bots) + len(self.checkpoints)

    def add_bot(self, fn: Bot | BotPlayer, name: str | None = None) -> None:
        p = fn if isinstance(fn, BotPlayer) else BotPlayer(fn, name or getattr(fn, "__name__", "bot"))
        if any(b.name == p.name for b in self.bots):
            raise ValueError(f"a bot named {p.name!r} is already in the pool")
        self.bots.append(p)

    def add_checkpoint(self, path: str, step: int, name: str | None = None) -> None:
        self.checkpoints.append(_Checkpoint(str(path), int(step), name or f"ckpt-{step}"))
        if self.max_checkpoints and len(self.checkpoints) > self.max_checkpoints:
            del self.checkpoints[: len(self.checkpoints) - self.max_checkpoints]
            self._forget_dropped()

    def _forget_dropped(self) -> None:
        """Unload the snapshots the pool no longer holds (never drawn again; a held
        snapshot folder's weights never change, so its loaded player stays) and drop
        their scores."""
        held = {c.path for c in self.checkpoints}
        for path in [p for p in self._cache if p not in held]:
            self._uncache(path)
        names = set(self.names())
        self.scores = {n: x for n, x in self.scores.items() if n in names}

    def names(self) -> list[str]:
        """The entries' names: bots, then checkpoints oldest to newest."""
        return [b.name for b in self.bots] + [c.name for c in self.checkpoints]

    def record(self, results: Mapping[str, Sequence[float]]) -> None:
        """One step's games: ``{entry name: the learner's scores (1 win, 1/2 draw, 0 loss)}``;
        moves each named entry's score towards the step's mean (``score_rate``)."""
        for name, games in results.items():
            if games:
                x = self.scores.get(name, PRIOR_SCORE)
                self.scores[name] = x + self.score_rate * (sum(games) / len(games) - x)

    def probabilities(self) -> list[float]:
        """Sampling probability of each entry: bots, then checkpoints oldest to newest."""
        n = len(self.checkpoints)
        if not len(self):
            raise ValueError("the opponent pool is empty; add a bot or a checkpoint")
        if self.mode == "pfsp":
            w = [(1 - self.scores.get(name, PRIOR_SCORE)) ** self.power for name in self.names()]
            if not sum(w):  # the learner beats every entry: all alike
                w = [1.0] * len(w)
        elif self.mode == "uniform":
            w = [1.0] * (len(self.bots) + n)
        else:
            w = [1.0] * len(self.bots) + [self.decay ** (n - 1 - i) for i in range(n)]
        total = sum(w)
        return [x / total for x in w]

    def sample(self, rng: random.Random | None = None) -> Player:
        """An entry drawn with `probabilities`, from ``rng`` (default: the pool's own)."""
        k = (rng or self.rng).choices(range(len(self)), weights=self.probabilities())[0]
        if k < len(self.bots):
            return self.bots[k]
        return self._player(self.checkpoints[k - len(self.bots)])

    def _player(self, ck: _Checkpoint) -> ModelPlayer:
        if ck.path in self._cache:
            self._cache.move_to_end(ck.path)
            return self._cache[ck.path]
        p = as_player(self.loader(ck.path))
        player = (ModelPlayer(p.policy, name=ck.name, train=False, explore=self.explore,
                              explore_turns=self.explore_turns,
                              explore_tactical=self.explore_tactical, sampling=self.sampling)
                  if isinstance(p, ModelPlayer) else p)
        self._cache[ck.path] = player
        while len(self._cache) > self.cache_size:
            self._uncache(next(iter(self._cache)))
        return player

    def loaded(self) -> dict[str, Player]:
        """The snapshot players in the cache by path, least recently drawn first."""
        return dict(self._cache)

    def _uncache(self, path: str) -> None:
        player = self._cache.pop(path)
        if self.unloader is not None:
            self.unloader(path, player)

    def set_explore(self, explore: float) -> None:
        """Epsilon of the snapshots from now on, those already loaded included."""
        self.explore = explore
        for player in self._cache.values():
            player.explore = explore

    def players_fn(self, learner: Any, num_seats: int) -> Callable[[int], list[Player]]:
        """Episode ``i``: the learner in seat ``i % num_seats``, sampled opponents elsewhere
        (`sparring.rollout.seating.rotating`)."""
        return rotating(as_player(learner), self.sample, num_seats)

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {"mode": self.mode, "decay": self.decay, "max_checkpoints": self.max_checkpoints,
                "bots": [b.name for b in self.bots],
                "checkpoints": [vars(c).copy() for c in self.checkpoints],
                "power": self.power, "score_rate": self.score_rate, "scores": dict(self.scores),
                "rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        names = [b.name for b in self.bots]
        if state["bots"] != names:
            raise ValueError(f"pool state has bots {state['bots']}, this pool has {names}; "
                             "add the same bots before loading")
        self.mode, self.decay = state["mode"], state["decay"]
        self.max_checkpoints = state["max_checkpoints"]
        self.checkpoints = [_Checkpoint(**c) for c in state["checkpoints"]]
        self.power = state.get("power", self.power)  # (older states have no scores)
        self.score_rate = state.get("score_rate", self.score_rate)
        self.scores = dict(state.get("scores", {}))
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self._forget_dropped()


def _load_hf(path: str) -> Any:
    from sparring.policy.hf import HFPolicy

    return HFPolicy.from_pretrained(path)
