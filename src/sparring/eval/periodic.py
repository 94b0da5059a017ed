"""The evaluation of a training run, every ``eval.every`` steps (and at the start and end).

``make_eval_fn(cfg, arena, policy)`` gives ``eval_fn(step, learner) -> metrics``. For every
game of the run (an env spec with two or more seats; an alias counts as its canonical
name) and every bot of ``eval.opponents``, ``eval.games`` games with the learner's seat
rotating (greedy by default; `sparring.eval.games.evaluate_vs_bot`): win / draw / loss and
the non-loss rate with Wilson 95% intervals, keys ``<game>/<bot>/<metric>``.

With ``eval.exact_vs_minimax`` and ``minimax`` among the opponents, also the exact rates
against it (`sparring.eval.vs_minimax`: over the bot's random tie-breaks, no sampling
error) and ``blunder_states``, the reachable positions where the policy plays a losing
move, keys ``<game>/minimax_exact/<metric>``; with a magnet (below) and ``eval.average``
the same for the magnet, ``<game>/minimax_exact_average/<metric>``: whether the average of
recent policies plays better than the last one.

With ``eval.exploitability``, a game that declares its tree (`sparring.envs.has_game_tree`)
also gets ``<game>/exploitability`` of the current policy and, when the run regularises
towards a magnet (``algorithm.kl.reference=magnet``) and ``eval.average`` is on (the
default), ``<game>/exploitability_average`` of
the magnet: the learner's EMA of the policy's weights, i.e. an average of recent policies.
With ``eval.self_play`` the policy also plays every seat of each game itself, ``eval.games``
games, keys ``<game>/joint/<metric>`` as below.

Several policies (``policy`` a ``{name: policy}`` mapping, ``learner`` a ``{name: Learner}``
mapping; the seats of a game are those of its first env spec): each policy plays the bots
in its own seats only, keys ``policy/<name>/<game>/<bot>/<metric>``; the policies together,
each in its seats, play ``eval.games`` games, keys ``<game>/joint/<metric>``
(`sparring.eval.games.evaluate_together`: mean score per seat -- the success rate of a
cooperative game --, forfeit and invalid rates); exploitability is that of the profile
(each seat's own policy), the average one that of the magnets when every policy has one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sparring.envs import env_entry, has_game_tree, make
from sparring.envs.bots import check_opponents, make_bot
from sparring.eval.games import (
    evaluate_together,
    evaluate_vs_bot,
    policy_exploitability,
    policy_vs_minimax,
)
from sparring.policy.hf import HFPolicy
from sparring.rollout.arena import Arena
from sparring.rollout.schedule import rollout_sampling

if TYPE_CHECKING:
    from sparring.train.config import Config

# eval_fn(step, learner) -> metrics: ``learner`` is the training loop's `Learner` (or
# ``{name: Learner}`` with several policies; None outside training), which supplies the magnet
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


def magnet_policy(cfg: Config, policy: HFPolicy, learner: Any) -> HFPolicy | None:
    """The learner's magnet as a policy (``algorithm.kl.reference=magnet``), else None."""
    if learner is None or learner.ref_model is None \
            or getattr(learner, "cfg", cfg).algorithm.kl.reference != "magnet":
        return None  # the learner's own config: a policy may set its own kl.reference
    return HFPolicy(learner.ref_model, policy.tokenizer, device=cfg.model.device, name="magnet",
                    adapter=getattr(learner, "adapter", None))


def make_eval_fn(cfg: Config, arena: Arena, policy: HFPolicy | Mapping[str, HFPolicy]
                 ) -> EvalFn:
    """``eval_fn(step, learner=None)``: the metrics above; ``learner`` (the training loop's
    `Learner`, or ``{name: Learner}``) supplies the magnet."""
    e = cfg.eval
    check_opponents("eval.opponents", e.opponents)
    sampling = rollout_sampling(cfg.rollout, greedy=e.greedy)
    games = list(dict.fromkeys(env_entry(s.name).name for s in cfg.envs
                               if make(s.name, **s.options).num_seats >= 2))
    policies = dict(policy) if isinstance(policy, Mapping) else None

    def vs_bots(p: HFPolicy, name: str, options: dict[str, Any], step: int,
                seats: list[int] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for opp in e.opponents:
            res = evaluate_vs_bot(arena, p, sampling, name, options, make_bot(opp, 10_000 + step),
                                  e.games, seed=cfg.train.seed + 1_000_000, seats=seats)
            out.update({f"{name}/{opp}/{k}": v for k, v in res.items()})
        if e.exact_vs_minimax and "minimax" in e.opponents:
            res = policy_vs_minimax(arena, p, name, options, e.greedy,
                                    range(2) if seats is None else seats).rates()
            out.update({f"{name}/minimax_exact/{k}": v for k, v in res.items()})
        return out

    def eval_one(step: int, learner: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in games:
            options = env_options(cfg, name)
            out.update(vs_bots(policy, name, options, step))
            magnet = magnet_policy(cfg, policy, learner) if e.average else None
            if e.exact_vs_minimax and "minimax" in e.opponents and magnet is not None:
                res = policy_vs_minimax(arena, magnet, name, options, e.greedy, range(2)).rates()
                out.update({f"{name}/minimax_exact_average/{k}": v for k, v in res.items()})
            if e.self_play:
                res = evaluate_together(arena, [policy] * make(name, **options).num_seats,
                                        sampling, name, options, e.games,
                                        seed=cfg.train.seed + 1_000_000)
                out.update({f"{name}/joint/{k}": v for k, v in res.items()})
            if e.exploitability and has_game_tree(name):
                out[f"{name}/exploitability"] = policy_exploitability(arena, policy, name, options)
                if magnet is not None:
                    out[f"{name}/exploitability_average"] = policy_exploitability(
                        arena, magnet, name, options)
        return out

    def eval_several(step: int, learners: Mapping[str, Any] | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in games:
            options, seats = env_options(cfg, name), env_seats(cfg, name)
            for pname in dict.fromkeys(seats):
                mine = [s for s, n in enumerate(seats) if n == pname]
                res = vs_bots(policies[pname], name, options, step, mine)
                out.update({f"policy/{pname}/{k}": v for k, v in res.items()})
            profile = [policies[n] for n in seats]
            res = evaluate_together(arena, profile, sampling, name, options, e.games,
                                    seed=cfg.train.seed + 1_000_000)
            out.update({f"{name}/joint/{k}": v for k, v in res.items()})
            if e.exploitability and has_game_tree(name):
                out[f"{name}/exploitability"] = policy_exploitability(arena, profile, name,
                                                                      options)
                magnets = {n: magnet_policy(cfg, policies[n], (learners or {}).get(n))
                           for n in dict.fromkeys(seats)}
                if e.average and all(m is not None for m in magnets.values()):
                    out[f"{name}/exploitability_average"] = policy_exploitability(
                        arena, [magnets[n] for n in seats], name, options)
        return out

    def eval_fn(step: int, learner: Any = None) -> dict[str, Any]:
        return eval_one(step, learner) if policies is None else eval_several(step, learner)

    return eval_fn
