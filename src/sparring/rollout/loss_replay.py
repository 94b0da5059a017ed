"""Loss replay: training groups that start again where the learner went on to lose
(the ``loss_replay`` start of ``envs[].starts``, `sparring.envs.starts`).

Self-play meets a position as often as its own play leads there, so a mistake in a
position it seldom reaches is seldom punished and seldom learned from: the default
tic-tac-toe recipe's misses are such positions (docs/benchmarks.md). Loss replay keeps
the positions that preceded a lost game and starts a share of the next steps' groups
from them, so a group's episodes compare their moves where a move once cost the game.

What is kept: in every training episode of the spec (one whose env recorded its start,
``info["start"]``: `sparring.envs.wrappers.RandomOpening`), each seat played by a trained
player whose game return is below the best seat's (a loss, or a worse share of a
many-seat game) gives its last ``depth`` decision points; a decision point is the
position before one of its moves, as ``(reset seed, moves before it)``. The buffer holds
the ``size`` most recently added distinct positions (by the env's ``state_key``; a
position added again moves to the front with its latest replay), so positions that keep
costing games stay, and those the learner no longer loses from age out. A replayed group
starts from one of them drawn uniformly (the wrapper's ``replayed_share`` draw).

Our design, in the line of exploring starts (Sutton and Barto, Monte Carlo ES) with the
start distribution prioritised by outcome as Prioritized Level Replay (Jiang et al.,
2021) prioritises levels; neither paper defines this rule. Deterministic: the buffer
changes only between steps (`Rollouts.record`), in the order of the step's episodes,
and it is part of the rollouts' checkpointed state.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sparring.config.plan import group_tasks

if TYPE_CHECKING:
    from sparring.config import Config
    from sparring.data import Episode

Start = tuple[int, tuple[str, ...]]  # (reset seed, moves): a position to replay


class LossReplay:
    """The replayed starts of one env spec (module docstring): at most ``size`` distinct
    positions, each seat's last ``depth`` decision points of the games it lost."""

    def __init__(self, size: int, depth: int):
        if size < 1 or depth < 1:
            raise ValueError(f"LossReplay: size={size}, depth={depth}; both must be >= 1")
        self.size, self.depth = size, depth
        self.entries: OrderedDict[str, Start] = OrderedDict()  # state key -> start, oldest first

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, episode: Episode, trainers: Collection[str]) -> int:
        """The decision points of ``episode``'s losing trained seats; how many were added
        (again) to the buffer."""
        start = episode.info.get("start")
        if start is None:
            return 0
        returns, names = episode.info["env_returns"], episode.info["players"]
        best, added = max(returns), 0
        for seat, r in enumerate(returns):
            if r >= best or names[seat] not in trainers:
                continue
            own = [j for j in range(start["opening"], len(start["moves"]))
                   if start["movers"][j] == seat]
            for j in own[-self.depth:]:
                self._put(start["keys"][j], (int(start["seed"]), tuple(start["moves"][:j])))
                added += 1
        return added

    def _put(self, key: str, start: Start) -> None:
        self.entries.pop(key, None)
        self.entries[key] = start
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)

    def starts(self) -> tuple[Start, ...]:
        """The positions a replayed group draws from, oldest first."""
        return tuple(self.entries.values())

    def state_dict(self) -> dict[str, Any]:
        return {"entries": [[k, seed, list(moves)] for k, (seed, moves) in self.entries.items()]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.entries = OrderedDict((k, (int(seed), tuple(moves)))
                                   for k, seed, moves in state["entries"])


def record_losses(replays: Mapping[int, LossReplay], cfg: Config,
                  episodes: Sequence[Episode], trainers: Collection[str]) -> dict[int, float]:
    """Each step's episodes into the replay of their env spec (``replays``: spec index ->
    buffer; a spec without one is skipped); per spec, the share of its episodes that
    started from a replayed position."""
    tasks = {t.group: t for t in group_tasks(cfg)}
    seen: dict[int, list[bool]] = {i: [] for i in replays}
    for ep in episodes:
        t = tasks.get(ep.group)
        if t is None or t.spec not in replays:
            continue
        replays[t.spec].add(ep, trainers)
        seen[t.spec].append(ep.info.get("start", {}).get("source") == "replayed")
    return {i: sum(s) / len(s) for i, s in seen.items() if s}
