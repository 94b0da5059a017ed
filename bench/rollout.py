"""Rollout throughput: the batched arena against a naive loop and against bare model.generate.

    PYTHONPATH=src python bench/rollout.py            # 256 episodes (the default)
    PYTHONPATH=src python bench/rollout.py --quick    # a small run to check the script works

Prints, from one run, with the tiny model on tic-tac-toe self-play (constrained decoding,
so every move is legal and episodes have their real length):

1. turns/s of `Arena.run_episodes` over N concurrent episodes against a naive loop that plays one
   episode at a time (one generate call per move, batch 1; same model, same sampling).
   Target: >= 10x.
2. generated tokens/s of the whole arena (prompt rendering, env steps, parsing included)
   against bare ``model.generate`` re-run on the arena's own prompt batches, each forced to
   the same number of decoding steps the arena took for that batch (so both do the same
   model work). Overhead = arena time / generate time - 1. Target: < 15%.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from sparring.envs.invalid import InvalidActionPolicy
from sparring.policy.hf import HFPolicy
from sparring.policy.sampling import SamplingParams
from sparring.policy.tiny import build_tiny_model
from sparring.rollout.arena import Arena
from sparring.rollout.prompts import PromptConfig


def _check_env() -> None:
    from sparring.envs import make

    try:
        make("tictactoe")
    except (KeyError, ModuleNotFoundError) as e:
        sys.exit(f"bench/rollout.py needs the tic-tac-toe environment: {e}")


class Recorder:
    """Wraps a policy; records every generate call's prompts and generated token counts."""

    def __init__(self, policy: HFPolicy):
        self.policy, self.tokenizer, self.name = policy, policy.tokenizer, policy.name
        self.calls: list[tuple[list[list[int]], list[int]]] = []
        self.seconds = 0.0

    def generate(self, prompts, sampling=None, allowed=None):
        t = time.perf_counter()
        gens = self.policy.generate(prompts, sampling, allowed=allowed)
        self.seconds += time.perf_counter() - t
        self.calls.append(([list(p) for p in prompts], [len(g.token_ids) for g in gens]))
        return gens


def bare_generate_seconds(model, tok, calls, temperature: float, device: str) -> float:
    """model.generate on each recorded batch, forced to the arena's number of steps."""
    total = 0.0
    for prompts, lens in calls:
        L = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), L), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, L - len(p):] = torch.tensor(p)
            mask[i, L - len(p):] = 1
        steps = max(lens)
        ids, mask = ids.to(device), mask.to(device)
        _sync(device)
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature,
                           top_k=0, top_p=1.0, max_new_tokens=steps, min_new_tokens=steps,
                           pad_token_id=tok.pad_token_id)
        _sync(device)
        total += time.perf_counter() - t
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--naive-episodes", type=int, default=32, help="episodes for the slow naive loop")
    ap.add_argument("--history", default="full", choices=["full", "last_k", "state"])
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument("--system-prompt", default=None,
                    help="override the env's system prompt ('' drops it, as configs/default.yaml)")
    ap.add_argument("--model", default=None,
                    help="tiny model sizes as YAML, e.g. '{hidden_size: 64, num_layers: 2}'")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each side; the fastest counts")
    ap.add_argument("--quick", action="store_true", help="16 arena and 4 naive episodes, 1 run")
    a = ap.parse_args()
    if a.quick:
        a.episodes, a.naive_episodes, a.repeat = 16, 4, 1
    if a.threads:
        torch.set_num_threads(a.threads)
    _check_env()
    import yaml

    model, tok = build_tiny_model(yaml.safe_load(a.model) if a.model else None)
    model.to(a.device)
    sp = SamplingParams(temperature=a.temperature, max_new_tokens=4)
    arena = Arena(sp, PromptConfig(a.history, system_prompt=a.system_prompt), InvalidActionPolicy("constrained"), max_turns=20)

    rec = Recorder(HFPolicy(model, tok, device=a.device, seed=0, name="tiny"))
    arena.run_episodes("tictactoe", seeds=[0], group_size=2, seat_players=rec)  # warm-up
    best = None  # (seconds, turns, calls, seconds in generate) of the fastest arena run
    for _ in range(a.repeat):
        rec.calls = []
        rec.seconds = 0.0
        t = time.perf_counter()
        eps = arena.run_episodes("tictactoe", seeds=range(a.episodes), seat_players=rec)
        t_run = time.perf_counter() - t
        if best is None or t_run < best[0]:
            best = (t_run, sum(len(e.turns) for e in eps), rec.calls, rec.seconds)
    t_arena, turns, calls, gen_s = best
    tokens = sum(sum(lens) for _, lens in calls)

    naive_pol = HFPolicy(model, tok, device=a.device, seed=1, name="tiny")
    naive_tps, t_naive = 0.0, 0.0  # the fastest naive run (turns/s, its seconds)
    for _ in range(a.repeat):
        t = time.perf_counter()
        n_turns = 0
        for s in range(a.naive_episodes):
            n_turns += sum(len(e.turns) for e in arena.run_episodes("tictactoe", seeds=[s],
                                                              seat_players=naive_pol))
        dt = time.perf_counter() - t
        if n_turns / dt > naive_tps:
            naive_tps, t_naive = n_turns / dt, dt

    t_bare = min(bare_generate_seconds(model, tok, calls, a.temperature, a.device)
                 for _ in range(a.repeat))
    print(f"device={a.device} threads={torch.get_num_threads()} history={a.history} episodes={a.episodes} "
          f"turns={turns} generate_calls={len(calls)} tokens={tokens} (best of {a.repeat} runs each)")
    arena_tps = turns / t_arena
    print(f"arena:  {arena_tps:9.1f} turns/s ({t_arena:.2f} s, {gen_s / t_arena:.0%} in generate)")
    print(f"naive:  {naive_tps:9.1f} turns/s ({a.naive_episodes} episodes one at a time, {t_naive:.2f} s)")
    print(f"speed-up arena/naive: {arena_tps / naive_tps:.1f}x (target >= 10x)")
    print(f"arena tokens/s {tokens / t_arena:9.1f}; bare model.generate on the same batches "
          f"{tokens / t_bare:9.1f} ({t_bare:.2f} s)")
    print(f"arena overhead vs bare generate: {t_arena / t_bare - 1:+.1%} (target < 15%)")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
