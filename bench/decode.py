"""Sampling speed of `HFPolicy` with ``decode="dynamic"`` against ``decode="compiled"``.

    PYTHONPATH=src python bench/decode.py                               # SmolLM2 shape, CPU
    PYTHONPATH=src python bench/decode.py --device cuda --batch 64 --prompt 256 --new 128

Both arms sample the same prompts with the same per-prompt seeds through
`HFPolicy.generate` (prefill, then one decode step a token; no EOS is sampled, so every
row runs ``--new`` tokens), alternating, ``--repeats`` times each after one untimed call of
the same shapes (the compiled arm compiles there; its seconds are printed). Prints each
arm's median tokens a second (prefill included), their ratio, and the share of rows whose
tokens agree. Models are built from their configs with random weights (`gpu.SHAPES`), in
the precision ``model.precision: --precision`` picks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu import QUICK_SHAPE, SHAPES, _sync, build_shaped  # noqa: E402
from sparring.policy import precision  # noqa: E402
from sparring.policy.hf import HFPolicy  # noqa: E402
from sparring.policy.sampling import SamplingParams  # noqa: E402


class _NoTextTokenizer:
    """What `HFPolicy` reads of a tokenizer, for a model with random weights: an EOS id the
    sampler never draws (it is masked out) and no text."""

    def __init__(self, vocab: int):
        self.eos_token_id = vocab - 1
        self.pad_token_id = 0

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return ""


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="smollm2-135m", choices=[*SHAPES, "quick"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=96, help="prompt tokens (each prompt)")
    ap.add_argument("--new", type=int, default=24, help="new tokens a row")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--precision", default="auto", choices=precision.PRECISIONS,
                    help="as model.precision")
    args = ap.parse_args(argv)
    shape = QUICK_SHAPE if args.shape == "quick" else SHAPES[args.shape]
    model = build_shaped(shape, args.device)
    chosen = precision.resolve(args.precision, args.device,
                               sum(p.numel() for p in model.parameters())).mode
    precision.apply(model, chosen)
    vocab = model.config.vocab_size
    with torch.no_grad():  # the EOS row of the head never wins: rows run --new tokens
        model.get_output_embeddings().weight[vocab - 1] = -1e4
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, vocab - 1, (args.prompt,), generator=g).tolist()
               for _ in range(args.batch)]
    seeds = list(range(args.batch))
    sp = SamplingParams(temperature=1.0, max_new_tokens=args.new)
    arms = {kind: HFPolicy(model, _NoTextTokenizer(vocab), device=args.device, decode=kind)
            for kind in ("dynamic", "compiled")}

    def timed(kind: str):
        _sync(args.device)
        t0 = time.perf_counter()
        gens = arms[kind].generate(prompts, sp, seeds=seeds)
        _sync(args.device)
        return time.perf_counter() - t0, gens

    warm = {kind: timed(kind)[0] for kind in arms}
    seconds: dict[str, list[float]] = {kind: [] for kind in arms}
    tokens: dict[str, list] = {}
    for _ in range(args.repeats):
        for kind in arms:
            s, gens = timed(kind)
            seconds[kind].append(s)
            tokens[kind] = [x.token_ids for x in gens]
    rate = {k: args.batch * args.new / statistics.median(v) for k, v in seconds.items()}
    same = sum(a == b for a, b in zip(tokens["dynamic"], tokens["compiled"])) / args.batch
    result = {"shape": args.shape, "device": args.device, "precision": chosen,
              "batch": args.batch, "prompt": args.prompt, "new": args.new,
              "tokens_per_s": rate, "compiled_over_dynamic": rate["compiled"] / rate["dynamic"],
              "first_call_s": warm, "rows_with_equal_tokens": same}
    print(f"{args.shape} on {args.device} ({chosen}), {args.batch} prompts x {args.prompt} "
          f"tokens, {args.new} new: dynamic {rate['dynamic']:.0f} tok/s, compiled "
          f"{rate['compiled']:.0f} tok/s, compiled / dynamic {result['compiled_over_dynamic']:.2f}; "
          f"first call {warm['dynamic']:.1f} s / {warm['compiled']:.1f} s (compiles); "
          f"rows with equal tokens {same:.2f}")
    return result


if __name__ == "__main__":
    main()
