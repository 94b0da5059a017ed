"""Evaluation of a model policy in games: matches against bots, exact exploitability.

* `evaluate_vs_bot`: ``n`` games through the arena, the learner in seat ``i % seats`` of
  game ``i`` (so every seat is played equally often), the bot elsewhere. Outcome
  (`outcome`): a game the learner forfeited (an invalid move under the ``forfeit`` or
  ``retry`` policy, ``info["forfeit"]``) is a loss whatever the score; otherwise the game's
  own score (``info["env_returns"]``, no invalid-move penalties): win > 0, draw = 0,
  loss < 0. Reports rates with Wilson 95% intervals (``_lo``/``_hi``), per-seat non-loss
  rates, the forfeit rate, the mean return (a forfeited game counts its arena total, the
  penalty included) and the learner's invalid-action rate.
  ``seats``: the learner rotates over those seats only (a policy that plays some roles).
* `evaluate_together`: ``n`` games with a given player in every seat (the policies of a
  run with several policies, each in its own seats): the mean game score per seat
  (``mean_return_seat{s}``, from ``info["env_returns"]``: in a cooperative game such as
  signalling, the success rate), the forfeit and invalid-action rates.
* `policy_exploitability`: the model's action probabilities at every information state
  of a game that declares its tree (Kuhn, Leduc poker; `sparring.envs.has_game_tree`) --
  the constrained-decoding distribution over legal actions, the prompt being the current
  observation only --, fed to `sparring.eval.exploitability`. ``policy`` may be a list
  with the policy of each seat (the profile of a run with several policies).
* `policy_vs_minimax`: the exact win / draw / loss rates of the model against the minimax
  bot and its blunders (`sparring.eval.vs_minimax`), from the same distribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sparring.data import Episode
from sparring.envs import env_entry, make
from sparring.eval.exploitability import exploitability
from sparring.eval.stats import wilson
from sparring.eval.vs_minimax import VsMinimax, WonPosition, conversion_vs_minimax, exact_vs_minimax
from sparring.policy.forward import token_logprobs
from sparring.policy.hf import HFPolicy
from sparring.policy.precision import autocast_for
from sparring.policy.prefix import find_prefixes
from sparring.policy.sampling import SamplingParams
from sparring.rollout.arena import Arena
from sparring.rollout.players import BotPlayer, ModelPlayer
from sparring.rollout.prompts import PromptBuilder, PromptConfig
from sparring.rollout.seating import learner_seat, rotating


def outcome(ep: Episode, seat: int) -> tuple[int, float]:
    """(+1 win, 0 draw or -1 loss, return) of ``seat`` in a two-sided game ``ep``. A forfeit
    loses for the seat that forfeited and wins for the others, whatever the score (a game
    forfeited before any reward would otherwise look like a draw); its return is the
    arena's total, penalty included. Otherwise the sign of the game's own score."""
    forfeit = ep.info.get("forfeit")
    if forfeit is not None:
        return (-1 if forfeit == seat else 1), float(ep.returns[seat])
    r = float(ep.info.get("env_returns", ep.returns)[seat])
    return (r > 0) - (r < 0), r


def evaluate_vs_bot(arena: Arena, policy: HFPolicy, sampling: SamplingParams, env: str,
                    options: dict[str, Any], bot: Any, n: int, seed: int = 0,
                    seats: Sequence[int] | None = None) -> dict[str, float]:
    """See the module docstring; ``seats``: the seats the policy plays (default: all)."""
    if n < 1:
        raise ValueError(f"games: must be >= 1, got {n}")
    me = ModelPlayer(policy, name="eval", train=False, sampling=sampling)
    other = BotPlayer(bot, name="bot")
    num_seats = make(env, **options).num_seats
    order = list(range(num_seats)) if seats is None else list(seats)
    eps = arena.run_episodes(env, dict(options), seeds=[seed + i for i in range(n)], group_size=1,
                     players_fn=rotating(me, lambda: other, num_seats, order))
    wins = draws = losses = forfeits = 0
    ret = 0.0
    per_seat = {s: [0, 0] for s in sorted(set(order))}  # [non-losses, games]
    my_turns = invalid = 0
    for i, ep in enumerate(eps):
        seat = learner_seat(i, num_seats, order)
        score, r = outcome(ep, seat)
        ret += r
        wins, draws, losses = wins + (score > 0), draws + (score == 0), losses + (score < 0)
        forfeits += ep.info.get("forfeit") == seat
        per_seat[seat][0] += score >= 0
        per_seat[seat][1] += 1
        mine = [t for t in ep.turns if t.agent == seat]
        my_turns += len(mine)
        invalid += sum(t.invalid is not None for t in mine)
    out: dict[str, float] = {"games": float(n), "mean_return": ret / n}
    for key, k in (("win", wins), ("draw", draws), ("loss", losses), ("non_loss", wins + draws)):
        lo, hi = wilson(k, n)
        out[key], out[f"{key}_lo"], out[f"{key}_hi"] = k / n, lo, hi
    for s, (k, m) in per_seat.items():
        out[f"non_loss_seat{s}"] = k / max(m, 1)
    out["forfeit_rate"] = forfeits / n
    out["invalid_rate"] = invalid / max(my_turns, 1)
    return out


def evaluate_together(arena: Arena, policies: Sequence[HFPolicy], sampling: SamplingParams,
                      env: str, options: dict[str, Any], n: int, seed: int = 0
                      ) -> dict[str, float]:
    """``n`` games with ``policies[s]`` in seat ``s``: the mean game score of each seat
    ``mean_return_seat{s} = (1/n) sum_games env_returns[s]`` (a forfeit scores the arena's
    total, penalty included), the forfeit rate and the invalid-action rate."""
    if n < 1:
        raise ValueError(f"games: must be >= 1, got {n}")
    players = {id(p): ModelPlayer(p, name=f"eval{s}", train=False, sampling=sampling)
               for s, p in enumerate(policies)}
    eps = arena.run_episodes(env, dict(options), seeds=[seed + i for i in range(n)], group_size=1,
                     seat_players=[players[id(p)] for p in policies])
    out: dict[str, float] = {"games": float(n)}
    for s in range(len(policies)):
        out[f"mean_return_seat{s}"] = sum(outcome(ep, s)[1] for ep in eps) / n
    turns = [t for ep in eps for t in ep.turns]
    out["forfeit_rate"] = sum(ep.info.get("forfeit") is not None for ep in eps) / n
    out["invalid_rate"] = sum(t.invalid is not None for t in turns) / max(len(turns), 1)
    return out


_POINTS: dict[str, dict[str, tuple[int, Any]]] = {}  # the walk is deterministic: done once


def _decision_points(env_name: str, options: dict[str, Any]) -> dict[str, tuple[int, Any]]:
    """Every information state -> (seat, a copy of an env at it), by walking all deals."""
    key = repr((env_entry(env_name).name, sorted(options.items())))
    if key not in _POINTS:
        _POINTS[key] = _walk_decision_points(env_name, options)
    return _POINTS[key]


def _walk_decision_points(env_name: str, options: dict[str, Any]) -> dict[str, tuple[int, Any]]:
    env = make(env_name, **options)
    found: dict[str, tuple[int, Any]] = {}

    def walk(e: Any) -> None:
        seat = e.current_seat()
        if seat is None:
            return
        found.setdefault(e.info_state(seat), (seat, e.clone()))
        for a in e.legal_actions(seat):
            child = e.clone()
            child.step(a)
            walk(child)

    for deal in env.deal_outcomes():
        e = make(env_name, **options)
        e.reset(0)
        e.reset_deal(deal)
        walk(e)
    return found


@torch.no_grad()
def action_probabilities(policy: HFPolicy, prompts: list[list[int]],
                         legal: list[list[str]], answer_format: str = "{}"
                         ) -> list[dict[str, float]]:
    """Probability of each legal action under constrained decoding (product over the
    action's tokens of the distribution restricted to the trie's children), each action
    written as ``answer_format.format(action)``: with "<answer>{}</answer>" the tokens all
    actions share are forced (probability 1 under the restriction), so the result is the
    model's choice among the moves within its answer format, renormalised over them.

    A prompt runs once for all its moves, and a start every prompt shares once
    (`sparring.policy.prefix`): only the moves' tokens reach the LM head, so a real model's
    vocabulary is not applied to every prompt token of every (prompt, move) row."""
    rows, allowed, index = [], [], []
    for i, (p, acts) in enumerate(zip(prompts, legal)):
        written = [answer_format.format(a) for a in acts]
        trie = policy.encode_actions(written)
        for a, text in zip(acts, written):
            seq = policy.tokenizer.encode(text, add_special_tokens=False) + [policy.eos_ids[0]]
            node, restr = 0, {}
            for k, tok in enumerate(seq):
                restr[len(p) + k] = trie.allowed(node)
                node = trie.step(node, tok)
            rows.append(p + seq)
            allowed.append(restr)
            index.append((i, a, len(p), len(seq)))
    policy.activate()  # its adapter, when policies share a base model
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), policy.pad_id, dtype=torch.long)
    att = torch.zeros(len(rows), T, dtype=torch.bool)
    for j, r in enumerate(rows):
        ids[j, :len(r)] = torch.tensor(r)
        att[j, :len(r)] = True
    ids, att = ids.to(policy.device), att.to(policy.device)
    plen = torch.tensor([start for _, _, start, _ in index], device=policy.device)
    with autocast_for(policy.model):  # the precision the policy samples in
        lp, _ = token_logprobs(policy.model, ids, att, allowed=allowed,
                               prefixes=find_prefixes(ids, plen))
    out: list[dict[str, float]] = [{} for _ in prompts]
    for j, (i, a, start, n) in enumerate(index):
        out[i][a] = float(lp[j, start:start + n].float().sum().exp())
    # each row sums to 1 up to rounding (a product of several tokens' restricted
    # probabilities under bf16 autocast drifts by ~1e-6); the tree walks want it exact
    totals = [sum(row.values()) for row in out]
    return [{a: p / z for a, p in row.items()} for row, z in zip(out, totals)]


def position_prompts(policy: HFPolicy, arena: Arena, positions: Sequence[tuple[Any, int]]
                     ) -> list[list[int]]:
    """The prompt token ids of each (env, seat): the seat's current observation only (and
    the arena's system prompt), cut to the arena's ``max_prompt_tokens`` as the rollouts
    cut it."""
    builder = PromptBuilder(policy.tokenizer, PromptConfig(
        history="state", max_prompt_tokens=arena.prompt.max_prompt_tokens,
        system_prompt=arena.prompt.system_prompt,
        answer_prefix=arena.prompt.answer_prefix))  # it ends the prompt
    return [builder.build(e.system_prompt(seat), [], e.observation(seat)).ids
            for e, seat in positions]


def probabilities_at(policy: HFPolicy, arena: Arena, positions: Sequence[tuple[Any, int]]
                      ) -> list[dict[str, float]]:
    """`action_probabilities` of ``policy`` at each (env, seat), prompted as
    `position_prompts` says, 256 positions a batch."""
    prompts = position_prompts(policy, arena, positions)
    legal = [e.legal_actions(seat) for e, seat in positions]
    return [pr for s in range(0, len(prompts), 256)
            for pr in action_probabilities(policy, prompts[s:s + 256], legal[s:s + 256],
                                           arena.written_format)]


def policy_strategy(arena: Arena, policy: HFPolicy | Sequence[HFPolicy], env: str,
                    options: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The behaviour strategy of ``policy`` in every seat (or of ``policy[s]`` in seat
    ``s``): information state -> `action_probabilities` over its legal moves, the prompt
    being that state's observation, for every information state of a game with a tree
    (`sparring.envs.tree`), in the game's order of them."""
    points = _decision_points(env, options)
    per_seat = list(policy) if isinstance(policy, Sequence) else None
    table: dict[str, dict[str, float]] = {}
    for p in dict.fromkeys(per_seat or [policy]):  # each distinct policy, on its own seats
        keys = [k for k, (seat, _) in points.items() if per_seat is None or per_seat[seat] is p]
        probs = probabilities_at(p, arena, [(points[k][1], points[k][0]) for k in keys])
        table.update(zip(keys, probs))
    return {k: table[k] for k in points}


def policy_exploitability(arena: Arena, policy: HFPolicy | Sequence[HFPolicy], env: str,
                          options: dict[str, Any]) -> float:
    """Exploitability of ``policy`` in every seat, or of ``policy[s]`` in seat ``s``."""
    table = policy_strategy(arena, policy, env, options)
    return exploitability(env, lambda info, acts: table[info], **options)


def policy_vs_minimax(arena: Arena, policy: HFPolicy, env: str, options: dict[str, Any],
                      greedy: bool = True, seats: Sequence[int] = (0, 1)) -> VsMinimax:
    """The model against minimax, exactly: its constrained-decoding distribution (or, with
    ``greedy``, its most probable action) at each reachable position, the prompt being the
    current observation only, as in `policy_exploitability`."""
    return exact_vs_minimax(
        lambda: make(env, **options),
        lambda envs, seat: probabilities_at(policy, arena, [(e, seat) for e in envs]),
        seats, greedy)


def policy_conversion_vs_minimax(arena: Arena, policy: HFPolicy, env: str,
                                 options: dict[str, Any], greedy: bool = True,
                                 seats: Sequence[int] = (0, 1), plies: int = 3
                                 ) -> list[WonPosition]:
    """`conversion_vs_minimax` of the model: its exact win probability against minimax from
    each won position of its ``seats`` within the first ``plies`` moves (prompts as in
    `policy_vs_minimax`)."""
    return conversion_vs_minimax(
        lambda: make(env, **options),
        lambda envs, seat: probabilities_at(policy, arena, [(e, seat) for e in envs]),
        seats, greedy, plies)
