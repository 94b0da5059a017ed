"""The evaluation of a training run, every ``eval.every`` steps (and at the start and end);
its pieces (`seat_players`, `seat_profile`, `against_bots`) are also `sparring eval`'s.

``make_eval_fn(cfg, arena, policy)`` gives ``eval_fn(step, learner) -> metrics``. For every
game of the run (an env spec with two or more seats; an alias counts as its canonical
name) and every bot of ``eval.opponents``, ``eval.games`` games with the learner's seat
rotating (greedy by default; `sparring.eval.games.evaluate_vs_bot`): win / draw / loss and
the non-loss rate with Wilson 95% intervals, keys ``<game>/<bot>/<metric>``.

With ``minimax`` among the opponents, also the exact rates against it
(`sparring.eval.vs_minimax`: over the bot's random tie-breaks, no sampling error) and
``blunder_states``, the reachable positions where the policy plays a losing
move, keys ``<game>/minimax_exact/<metric>``; with a magnet (below) and ``eval.average``
the same for the magnet, ``<game>/minimax_exact_average/<metric>``: whether the average of
recent policies plays better than the last one.

With ``eval.exploitability``, a game that declares its tree (`sparring.envs.has_game_tree`)
also gets ``<game>/exploitability`` of the current policy and, when the run regularises
towards a magnet (``algorithm.kl.reference=magnet``) and ``eval.average`` is on (the
default), ``<game>/exploitability_average`` of
the magnet: the learner's EMA of the policy's weights, i.e. an average of recent policies;
with ``eval.time_average`` N, also ``<game>/exploitability_time_average``: that of the
reach-weighted average of the policies of the last N evaluations (this one included;
`sparring.eval.time_average`), an average in the game's sense rather than of weights. The
tables live in ``eval_fn.history`` (a `StrategyHistory`, None when off), a state of the
run that its checkpoints hold.
Every single-seat env of the run (a task) is played on ``eval.games`` held-out instances
(`sparring.eval.tasks.evaluate_task`: success, return, invalid and forfeit rates, turns,
and the means of the numbers the task reports when an episode ends, e.g. the calculator's
``correct`` and ``used_tool``), keys ``<task>/<metric>``; with ``eval.free_text`` and
constrained decoding, again with nothing constrained (an unreadable turn forfeits), keys
``<task>/free_text/<metric>``: whether the model writes the format it was held to.
With ``eval.self_play`` the policy also plays every seat of each game itself, ``eval.games``
games, keys ``<game>/joint/<metric>`` as below.

Several policies (``policy`` a ``{name: policy}`` mapping, ``learner`` a ``{name: Learner}``
mapping; the seats of a game are those of its first env spec): each policy plays the bots
in its own seats only, keys ``policy/<name>/<game>/<bot>/<metric>`` (the exact rates of its
magnet too, ``policy/<name>/<game>/minimax_exact_average/<metric>``); the policies together,
each in its seats, play ``eval.games`` games, keys ``<game>/joint/<metric>``
(`sparring.eval.games.evaluate_together`: mean score per seat -- the success rate of a
cooperative game --, forfeit and invalid rates); exploitability is that of the profile
(each seat's own policy), the average one that of the magnets when every policy has one.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sparring.envs import env_entry, has_game_tree, make
from sparring.envs.bots import check_opponents, make_bot
from sparring.envs.tree import game_tree
from sparring.eval.exploitability import exploitability
from sparring.eval.games import (
    evaluate_together,
    evaluate_vs_bot,
    policy_exploitability,
    policy_strategy,
    policy_vs_minimax,
)
from sparring.eval.tasks import evaluate_task
from sparring.eval.time_average import StrategyHistory
from sparring.policy.hf import HFPolicy
from sparring.rollout.arena import Arena
from sparring.rollout.rollouts import rollout_sampling

if TYPE_CHECKING:
    from sparring.config import Config

# eval_fn(step, learners) -> metrics: ``learners`` is the training loop's ``{name: Learner}``
# ('' names the one policy of a run; None outside training), which supplies the magnets
EvalFn = Callable[[int, Any], Mapping[str, Any]]


def env_options(cfg: Config, name: str) -> dict[str, Any]:
    """The options of env ``name`` (or an alias of it) in ``cfg``: those of its first spec,
    {} when the run has no spec of that env."""
    entry = env_entry(name)
    return next((dict(s.options) for s in cfg.envs if env_entry(s.name) is entry), {})


def env_seats(cfg: Config, name: str) -> list[str]:
    """The policy of each seat of env ``name`` in ``cfg`` (its first spec's ``seats``)."""
    entry = env_entry(name)
    return next((list(s.seats) for s in cfg.envs if env_entry(s.name) is entry), [])


def seat_players(names: Iterable[str], seats: Sequence[str]) -> list[tuple[str, list[int] | None]]:
    """Who plays a game and in which seats: with no ``seats`` (a run with one policy, or a game
    whose spec names none) each of ``names`` in every seat (None); else each name that owns
    seats, in its own (``names``' order)."""
    if not seats:
        return [(n, None) for n in names]
    return [(n, [s for s, owner in enumerate(seats) if owner == n]) for n in names if n in seats]


def seat_profile(policies: Mapping[str, HFPolicy], seats: Sequence[str]) -> Any:
    """The policy of every seat (a list by seat) when the game names its seats' policies,
    else the one policy (in every seat)."""
    return [policies[n] for n in seats] if seats else next(iter(policies.values()))


def against_bots(arena: Arena, policy: HFPolicy, game: str, options: dict[str, Any],
                 bots: Sequence[str], *, games: int, sampling: Any, bot_seed: int,
                 game_seed: int, seats: Sequence[int] | None = None, exact_minimax: bool = False,
                 greedy: bool = True, key: str = "eval.opponents") -> dict[str, Any]:
    """``policy`` in ``seats`` (default: every seat, rotating) against each bot of ``bots``:
    ``{bot: evaluate_vs_bot's rates}``; with ``exact_minimax`` and minimax among them, also
    ``"minimax_exact"``: `policy_vs_minimax`'s result (exact rates and blunders). A bot
    that cannot play ``game`` honestly is a ValueError naming ``key`` (`check_opponents`)."""
    check_opponents(key, bots, game=make(game, **options))
    out: dict[str, Any] = {
        bot: evaluate_vs_bot(arena, policy, sampling, game, options, make_bot(bot, bot_seed),
                             games, seed=game_seed, seats=seats) for bot in bots}
    if exact_minimax and "minimax" in bots:
        out["minimax_exact"] = policy_vs_minimax(arena, policy, game, options, greedy,
                                                 range(2) if seats is None else seats)
    return out


def magnet_policy(cfg: Config, policy: HFPolicy, learner: Any) -> HFPolicy | None:
    """The learner's magnet as a policy (``algorithm.kl.reference=magnet``), else None."""
    if learner is None or learner.ref_model is None \
            or getattr(learner, "cfg", cfg).algorithm.kl.reference != "magnet":
        return None  # the learner's own config: a policy may set its own kl.reference
    return HFPolicy(learner.ref_model, policy.tokenizer, device=cfg.model.device, name="magnet",
                    adapter=getattr(learner, "adapter", None))


def make_eval_fn(cfg: Config, arena: Arena, policy: HFPolicy | Mapping[str, HFPolicy]
                 ) -> EvalFn:
    """``eval_fn(step, learners=None)``: the metrics above; ``learners`` (the training
    loop's ``{name: Learner}``, '' for the one policy of a run) supply the magnets.
    ``policy``: the run's one policy (or ``{'': policy}``), or ``{name: policy}``."""
    e = cfg.eval
    check_opponents("eval.opponents", e.opponents)
    sampling = rollout_sampling(cfg.rollout, greedy=e.greedy)
    seats_of = {env_entry(s.name).name: make(s.name, **s.options).num_seats for s in cfg.envs}
    games = [g for g, n in seats_of.items() if n >= 2]
    tasks = [t for t, n in seats_of.items() if n == 1]
    policies: dict[str, HFPolicy] = dict(policy) if isinstance(policy, Mapping) else {"": policy}
    several = list(policies) != [""]  # {'': policy} is the one policy of a run
    exact = "minimax" in e.opponents
    trees = [g for g in games if has_game_tree(g)] if e.exploitability else []
    history = StrategyHistory(e.time_average) if trees and e.time_average else None

    free = None  # eval.free_text: the arena with nothing constrained
    if e.free_text and tasks and arena.invalid.mode == "constrained":
        free = copy.copy(arena)
        free.invalid = dataclasses.replace(arena.invalid, mode="forfeit")

    def key(name: str, rest: str) -> str:  # one policy's keys carry no policy/<name>/
        return f"policy/{name}/{rest}" if several else rest

    def eval_fn(step: int, learners: Mapping[str, Any] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for task in tasks:
            options = env_options(cfg, task)
            for name in dict.fromkeys((env_seats(cfg, task) if several else []) or policies):
                res = evaluate_task(arena, policies[name], sampling, task, options, e.games)
                out.update({key(name, f"{task}/{k}"): v for k, v in res.items()})
                if free is not None:
                    res = evaluate_task(free, policies[name], sampling, task, options, e.games)
                    out.update({key(name, f"{task}/free_text/{k}"): v for k, v in res.items()})
        for game in games:
            options, seats = env_options(cfg, game), env_seats(cfg, game) if several else []
            names = dict.fromkeys(seats or policies)  # the policies that play this game
            magnets = {n: magnet_policy(cfg, policies[n], (learners or {}).get(n))
                       if e.average else None for n in names}
            for name, mine in seat_players(names, seats):
                res = against_bots(arena, policies[name], game, options, e.opponents,
                                   games=e.games, sampling=sampling, bot_seed=10_000 + step,
                                   game_seed=cfg.train.seed + 1_000_000, seats=mine,
                                   exact_minimax=exact, greedy=e.greedy)
                for bot, r in res.items():
                    rates = r.rates() if bot == "minimax_exact" else r
                    out.update({key(name, f"{game}/{bot}/{k}"): v for k, v in rates.items()})
                if exact and magnets[name] is not None:
                    rates = policy_vs_minimax(arena, magnets[name], game, options, e.greedy,
                                              range(2) if mine is None else mine).rates()
                    out.update({key(name, f"{game}/minimax_exact_average/{k}"): v
                                for k, v in rates.items()})
            profile = seat_profile(policies, seats)
            if several or e.self_play:
                res = evaluate_together(
                    arena, profile if seats else [profile] * make(game, **options).num_seats,
                    sampling, game, options, e.games, seed=cfg.train.seed + 1_000_000)
                out.update({f"{game}/joint/{k}": v for k, v in res.items()})
            if game in trees:
                tree = game_tree(game, **options)
                sigma = tree.sigma_from(policy_strategy(arena, profile, game, options))
                out[f"{game}/exploitability"] = exploitability(tree, sigma)
                if history is not None:
                    history.record(game, step, sigma)
                    out[f"{game}/exploitability_time_average"] = history.exploitability(
                        game, **options)
                if all(m is not None for m in magnets.values()):
                    out[f"{game}/exploitability_average"] = policy_exploitability(
                        arena, seat_profile(magnets, seats), game, options)
        return out

    eval_fn.history = history  # type: ignore[attr-defined]
    return eval_fn
