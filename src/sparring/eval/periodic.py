"""The evaluation of a training run, every ``eval.every`` steps (and at the start and end).

``make_eval_fn(cfg, arena, policy)`` gives ``eval_fn(step, learner) -> metrics``. For every
game of the run (an env spec with two or more seats; an alias counts as its canonical
name) and every bot of ``eval.opponents``, ``eval.games`` games with the learner's seat
rotating (greedy by default; `sparring.eval.games.evaluate_vs_bot`): win / draw / loss and
the non-loss rate with Wilson 95% intervals, keys ``<game>/<bot>/<metric>``.

With ``eval.exploitability``, a game that declares its tree (`sparring.envs.has_game_tree`)
also gets ``<game>/exploitability`` of the current policy and, when the run regularises
towards a magnet (``algorithm.kl.reference=magnet``), ``<game>/exploitability_average`` of
the magnet: the learner's EMA of the policy's weights, i.e. an average of recent policies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sparring.envs import env_entry, has_game_tree, make
from sparring.envs.bots import BOTS, make_bot
from sparring.eval.games import evaluate_vs_bot, policy_exploitability
from sparring.policy.hf import HFPolicy
from sparring.policy.sampling import SamplingParams
from sparring.rollout.arena import Arena

if TYPE_CHECKING:
    from sparring.train.config import Config

EvalFn = Callable[[int, Any], dict[str, Any]]


def env_options(cfg: Config, name: str) -> dict[str, Any]:
    """The options of env ``name`` (or an alias of it) in ``cfg``: those of its first spec,
    {} when the run has no spec of that env."""
    entry = env_entry(name)
    return next((dict(s.options) for s in cfg.envs if env_entry(s.name) is entry), {})


def magnet_policy(cfg: Config, policy: HFPolicy, learner: Any) -> HFPolicy | None:
    """The learner's magnet as a policy (``algorithm.kl.reference=magnet``), else None."""
    if learner is None or cfg.algorithm.kl.reference != "magnet" or learner.ref_model is None:
        return None
    return HFPolicy(learner.ref_model, policy.tokenizer, device=cfg.model.device, name="magnet")


def make_eval_fn(cfg: Config, arena: Arena, policy: HFPolicy) -> EvalFn:
    """``eval_fn(step, learner=None)``: the metrics above; ``learner`` (the training loop's
    `Learner`) supplies the magnet."""
    e = cfg.eval
    unknown = [o for o in e.opponents if o not in BOTS]
    if unknown:
        raise ValueError(f"eval.opponents: unknown {', '.join(map(repr, unknown))}; "
                         f"allowed: {', '.join(BOTS.names())}")
    sampling = SamplingParams(temperature=cfg.rollout.temperature, greedy=e.greedy,
                              max_new_tokens=cfg.rollout.max_new_tokens)
    games = list(dict.fromkeys(env_entry(s.name).name for s in cfg.envs
                               if make(s.name, **s.options).num_seats >= 2))

    def eval_fn(step: int, learner: Any = None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in games:
            options = env_options(cfg, name)
            for opp in e.opponents:
                res = evaluate_vs_bot(arena, policy, sampling, name, options,
                                      make_bot(opp, 10_000 + step), e.games,
                                      seed=cfg.train.seed + 1_000_000)
                out.update({f"{name}/{opp}/{k}": v for k, v in res.items()})
            if e.exploitability and has_game_tree(name):
                out[f"{name}/exploitability"] = policy_exploitability(arena, policy, name, options)
                magnet = magnet_policy(cfg, policy, learner)
                if magnet is not None:
                    out[f"{name}/exploitability_average"] = policy_exploitability(
                        arena, magnet, name, options)
        return out

    return eval_fn
