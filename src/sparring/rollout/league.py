"""League scoring: the learner's results against the opponent pools' entries, from a step's
episodes, and the league metrics the training loop logs after each step.

``pools`` is ``{policy: pool}`` with several policies, ``{'': pool}`` with a run's one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from sparring.config.plan import group_tasks

if TYPE_CHECKING:
    from sparring.config import Config
    from sparring.data import Episode
    from sparring.rollout.opponents import OpponentPool


def record_scores(pools: Mapping[str, OpponentPool], cfg: Config,
                  episodes: Sequence[Episode], trainers: Collection[str]) -> None:
    """The learner's score against each pool entry it met in ``episodes`` (a step's, from
    any split of its groups), into the pools (`OpponentPool.record`; ``pfsp`` samples by it).
    In a game against the pool, each opponent seat scores 1 if the learner's game return
    (``info["env_returns"]``) beats that seat's, 1/2 if equal, 0 if below; with several
    policies it counts in the pool of the seat's policy. ``trainers``: the player names of
    the trained seats (the learner's one per episode)."""
    tasks = {t.group: t for t in group_tasks(cfg)}
    several = "" not in pools
    results: dict[str, dict[str, list[float]]] = {n: {} for n in pools}
    for ep in episodes:
        t = tasks.get(ep.group)
        spec = cfg.envs[t.spec] if t else None
        if spec is None or (spec.opponents or ["self"])[t.kind] != "pool":
            continue
        names, r = ep.info["players"], ep.info["env_returns"]
        me = next(s for s, n in enumerate(names) if n in trainers)
        for s, name in enumerate(names):
            if s != me:
                score = 1.0 if r[me] > r[s] else 0.5 if r[me] == r[s] else 0.0
                pool = spec.seats[s] if several else ""
                results[pool].setdefault(name, []).append(score)
    for n, pool in pools.items():
        pool.record(results[n])


def league_metrics(pools: Mapping[str, OpponentPool]) -> dict[str, float]:
    """The league as the training loop logs it after each step: per pool bot its score
    (``league/score/<bot>``) and sampling probability (``league/prob/<bot>``), the mean
    and the lowest score over the snapshots (``league/score/snapshots_mean``, ``_min``);
    with several policies ``league/<policy>/...``. Scored entries only."""
    out: dict[str, float] = {}
    for n, pool in pools.items():
        key = f"league/{n}/" if n else "league/"
        probs = dict(zip(pool.names(), pool.probabilities())) if len(pool) else {}
        for bot in pool.bots:
            if bot.name in pool.scores:
                out[f"{key}score/{bot.name}"] = pool.scores[bot.name]
                out[f"{key}prob/{bot.name}"] = probs[bot.name]
        snaps = [pool.scores[c.name] for c in pool.checkpoints if c.name in pool.scores]
        if snaps:
            out[f"{key}score/snapshots_mean"] = sum(snaps) / len(snaps)
            out[f"{key}score/snapshots_min"] = min(snaps)
    return out
