"""Self-play PPO for a language-model policy, in one file to read top to bottom.

    PYTHONPATH=src python examples/minimal_selfplay.py            # 100 steps, 2-3 minutes
    PYTHONPATH=src python examples/minimal_selfplay.py --steps 20

A tiny Llama-style model (built from a config, random weights, a character-level
tokenizer) learns two-player Kuhn poker by playing both seats. Every step:

1. rollout     the arena plays GROUPS x GROUP_SIZE games; the games of a group share one
               deal of the cards; every move the model samples is a row for the learner:
               its prompt tokens, its action tokens and their log-probs under the sampler;
2. collate     the episodes become a `TurnBatch` (padded tensors, one row per move);
3. advantages  GRPO: A = (R - mean R) / (std R + eps), statistics over the games of one
               group and one seat (a seat is compared only with itself: the game is
               zero-sum, pooling both seats would cancel);
4. update      EPOCHS passes over the batch, MINIBATCH rows per optimizer step, with the
               clipped PPO loss and an entropy bonus;
5. evaluate    the exact exploitability of the policy (what a best responder wins against
               it per game: 0 at a Nash equilibrium, 0.458 for uniform play).

With the settings below (seed 0, one thread) the exploitability falls from 0.50 to about
0.12 in 10 steps and stays between 0.06 and 0.16 up to step 100: the last iterate of
self-play circles the equilibrium rather than settling on it.

This is the loop `sparring train` runs with most options left out (a KL pull towards a
slow average of the policy, which stops that circling, schedules, opponent pools,
checkpoints); configs/kuhn_selfplay.yaml is the recipe that gets below 0.05. The
advantages, the loss and the update here equal the trainer's on the same batch
(tests/test_minimal_selfplay.py).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import Tensor

from sparring.advantages import estimate
from sparring.aggregation import aggregate
from sparring.data import Episode, TurnBatch, collate
from sparring.envs.invalid import InvalidActionPolicy
from sparring.eval.games import policy_exploitability
from sparring.policy.forward import token_logprobs
from sparring.policy.hf import HFPolicy
from sparring.policy.sampling import SamplingParams
from sparring.policy.tiny import build_tiny_model
from sparring.rollout.arena import Arena
from sparring.rollout.prompts import PromptConfig

# ---------------------------------------------------------------- configuration
ENV = "kuhn_poker"
ENV_OPTIONS = {"compact": True}  # observation: own card and the moves so far, e.g. "K|pb"
MODEL = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4,
             intermediate_size=256)  # about 0.14 M parameters
STEPS = 100
GROUPS = 16  # deals per step
GROUP_SIZE = 16  # games per deal: 256 games a step
MAX_NEW_TOKENS = 6  # "pass" or "bet" and the end token
TEMPERATURE = 1.0  # sampling temperature; the learner's log-probs use the same
ESTIMATOR = "grpo"  # any name of `sparring list estimators` that needs no critic
ESTIMATOR_OPTIONS: dict = {}  # grpo's defaults: scale by the std, eps = 1e-6
AGGREGATION = "token-mean"  # how per-token losses become one number
CLIP = 0.2  # PPO's epsilon: the ratio is clipped to [1 - CLIP, 1 + CLIP]
ENTROPY_COEF = 0.5  # weight of the entropy bonus, a mean over all action tokens: only the
#                    first token of "pass" / "bet" is a choice, so about 0.1 per decision
LR = 3e-4
EPOCHS = 2  # passes over each batch
MINIBATCH = 256  # rows per optimizer step
MAX_GRAD_NORM = 1.0
SEED = 0


# ---------------------------------------------------------------- the pieces
def build_policy(model_options: dict = MODEL, seed: int = SEED) -> HFPolicy:
    """The tiny model (as ``model.name: tiny`` builds it) wrapped for batched sampling."""
    model, tokenizer = build_tiny_model(dict(model_options, seed=seed))
    return HFPolicy(model, tokenizer, seed=seed, name="learner")


def build_arena() -> Arena:
    """Plays many games at once. Constrained decoding: the model samples only among the
    legal moves, so no move is ever invalid; each prompt is the current observation only."""
    return Arena(sampling=SamplingParams(temperature=TEMPERATURE, max_new_tokens=MAX_NEW_TOKENS),
                 prompt=PromptConfig(history="state", system_prompt=""),
                 invalid=InvalidActionPolicy("constrained"))


def rollout(arena: Arena, policy: HFPolicy, step: int, groups: int = GROUPS,
            group_size: int = GROUP_SIZE) -> list[Episode]:
    """Self-play games: the same policy in every seat. Game ``j * group_size + g`` is dealt
    from ``seeds[j]`` and belongs to group ``j``; ``sample_seeds`` give each game its own
    random stream, so a run repeats exactly."""
    seeds = [step * groups + j for j in range(groups)]
    return arena.run_episodes(ENV, ENV_OPTIONS, seeds=seeds, group_size=group_size,
                      seat_players=policy, sample_seeds=seeds)


def advantages(batch: TurnBatch) -> Tensor:
    """``[rows, T]``: each row's advantage on its action tokens, 0 elsewhere. GRPO reads the
    seat's return R of the game and, over the games of its (group, seat),
    A = (R - mean R) / (std R + eps); every move of the game gets its seat's A."""
    return estimate(ESTIMATOR, batch, **ESTIMATOR_OPTIONS)


def logprobs(model: torch.nn.Module, batch: TurnBatch, rows: Tensor) -> tuple[Tensor, Tensor, int]:
    """Log-probs and entropies ``[r, L]`` of ``rows`` under the current weights (with a
    gradient), cut to their longest row ``L``. Position t holds log p(token_t | tokens < t),
    renormalised over the tokens constrained decoding allowed there, as the sampler did."""
    att = batch.attention_mask[rows]
    L = int(att.sum(1).max())
    allowed = None if batch.allowed is None else [batch.allowed[i] for i in rows.tolist()]
    logp, ent = token_logprobs(model, batch.input_ids[rows, :L], att[:, :L], TEMPERATURE,
                               with_entropy=True, allowed=allowed)
    return logp, ent, L


def ppo_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, ent: Tensor, *,
             clip: float = CLIP, entropy_coef: float = ENTROPY_COEF,
             aggregation: str = AGGREGATION) -> tuple[Tensor, dict[str, float]]:
    """The loss to minimise over one mini-batch, all tensors ``[r, L]``:

        ratio   = exp(logp - logp_old)                          per action token
        l_t     = max(-A ratio, -A clip(ratio, 1 - clip, 1 + clip))
        loss    = agg(l) - entropy_coef * agg(H)

    ``agg`` is `sparring.aggregation.aggregate` under ``mask`` (token-mean: the mean over
    the mini-batch's action tokens). Taking the max of the two negated terms is PPO's
    pessimism: once the ratio has left the clip range in the direction A favours, the
    token's gradient is 0, so one batch cannot move the policy far.
    ``sparring.objectives.loss("ppo_clip", ...)`` is the registry's form of l_t."""
    log_ratio = (logp - old_logp).clamp(-20, 20)  # no exp overflow on a token far off-policy
    ratio = torch.exp(log_ratio)
    surrogate = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)) * mask
    policy_loss = aggregate(surrogate, mask, aggregation)
    entropy = aggregate(ent, mask, aggregation)
    loss = policy_loss - entropy_coef * entropy
    with torch.no_grad():
        m = mask.bool()
        stats = {"policy_loss": float(policy_loss), "entropy": float(entropy),
                 "clip_frac": float(((ratio < 1 - clip) | (ratio > 1 + clip))[m].float().mean()),
                 "approx_kl": float(((ratio - 1) - log_ratio)[m].mean())}  # k3 of KL(old || new)
    return loss, stats


def ppo_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: TurnBatch,
               adv: Tensor, gen: torch.Generator, epochs: int = EPOCHS,
               minibatch: int = MINIBATCH) -> dict[str, float]:
    """``epochs`` passes over the batch in a random order, one AdamW step per
    ``minibatch`` rows, the gradient first scaled to norm MAX_GRAD_NORM at most
    (g <- g * min(1, MAX_GRAD_NORM / |g|)); the old log-probs stay the sampler's, recorded
    at rollout, through every epoch."""
    model.train()
    totals: dict[str, float] = {}
    steps = 0
    for _ in range(epochs):
        perm = torch.randperm(batch.n_rows, generator=gen)
        for start in range(0, batch.n_rows, minibatch):
            rows = perm[start:start + minibatch]
            logp, ent, L = logprobs(model, batch, rows)
            mask = batch.action_mask[rows, :L]
            loss, stats = ppo_loss(logp, batch.old_logp[rows, :L], adv[rows, :L], mask, ent)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
            optimizer.step()
            steps += 1
            for k, v in {"loss": loss.item(), "grad_norm": grad_norm.item(), **stats}.items():
                totals[k] = totals.get(k, 0.0) + v
    model.eval()
    return {k: v / max(steps, 1) for k, v in totals.items()}


def evaluate(arena: Arena, policy: HFPolicy) -> float:
    """Exact exploitability: the model's probabilities of "pass" and "bet" at each of the
    game's 12 information states, then a best response against them over every deal."""
    return policy_exploitability(arena, policy, ENV, ENV_OPTIONS)


# ---------------------------------------------------------------- the loop
def main(steps: int = STEPS, seed: int = SEED, groups: int = GROUPS,
         group_size: int = GROUP_SIZE, model_options: dict = MODEL,
         log: bool = True) -> list[dict[str, float]]:
    """Train for ``steps`` steps; returns one dict of metrics per step."""
    policy = build_policy(model_options, seed)
    model = policy.model
    arena = build_arena()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, fused=True)
    gen = torch.Generator().manual_seed(seed)  # the mini-batches' order
    history = []
    start = time.time()
    if log:
        print(f"step 0: exploitability {evaluate(arena, policy):.3f} (uniform play: 0.458)")
    for step in range(1, steps + 1):
        # 1. play: groups x group_size self-play games with the current weights (no gradient)
        episodes = rollout(arena, policy, step, groups, group_size)
        # 2. one row per move the model made, padded to the longest
        batch = collate(episodes, pad_id=policy.pad_id)
        # 3. one advantage per row, on its action tokens
        adv = advantages(batch)
        # 4. PPO on this batch only; the next step samples from the new weights
        metrics = ppo_update(model, optimizer, batch, adv, gen)
        # 5. how far from equilibrium the policy now is
        metrics["exploitability"] = evaluate(arena, policy)
        history.append(metrics)
        if log:
            print(f"step {step}: exploitability {metrics['exploitability']:.3f}  "
                  f"loss {metrics['loss']:+.4f}  entropy {metrics['entropy']:.3f}  "
                  f"clip_frac {metrics['clip_frac']:.3f}  approx_kl {metrics['approx_kl']:.4f}  "
                  f"{time.time() - start:.0f}s")
    return history


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    main(args.steps, args.seed)
