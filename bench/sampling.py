"""The cost of drawing one token per row from a full vocabulary: `HFPolicy`'s inverse-CDF
draw (`sparring.policy.hf._sample_rows`) against ``torch.multinomial`` and against the same
draw with every row clamped to its last token of p > 0, in the same run.

    PYTHONPATH=src python bench/sampling.py                       # SmolLM2's 49,152 tokens
    PYTHONPATH=src python bench/sampling.py --vocab 103 --rows 288

Each arm draws from the same probabilities ``softmax(N(0, 1) logits) [rows, vocab]``, a
tenth of each row's tokens set to probability 0 (as constrained decoding does), alternating,
``--repeats`` times after one untimed call. Prints each arm's median milliseconds a draw and
its ratio to multinomial. The clamped arm finds every row's last token of p > 0 (a pass over
the whole ``[rows, vocab]``) where `_sample_rows` looks it up only for a row whose draw fell
past the end. The uniforms come from one generator, as when `HFPolicy.generate` is given no
per-prompt seeds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sparring.policy.hf import _sample_rows


def clamped(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The inverse-CDF draw with every row's result clamped to its last token of p > 0."""
    cdf = probs.cumsum(-1)
    tok = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1)
    return torch.minimum(tok, (probs > 0).long().cumsum(-1).argmax(-1))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--rows", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, vocab {a.vocab}")
    print(f"{'rows':>5} {'multinomial ms':>15} {'clamped ms':>11} {'ratio':>7} "
          f"{'inverse-CDF ms':>15} {'ratio':>7}")
    for rows in a.rows:
        z = torch.randn(rows, a.vocab, generator=g)
        z[torch.rand(rows, a.vocab, generator=g) < 0.1] = float("-inf")
        probs = torch.softmax(z, -1)
        arms = {"multinomial": lambda q, n: torch.multinomial(q, 1, generator=g).squeeze(-1),
                "clamped": lambda q, n: clamped(q, torch.rand(n, generator=g)),
                "inverse-CDF": lambda q, n: _sample_rows(q, torch.rand(n, generator=g))}
        times: dict[str, list[float]] = {k: [] for k in arms}
        for f in arms.values():
            f(probs, rows)
        for _ in range(a.repeats):
            for k, f in arms.items():
                t = time.perf_counter()
                f(probs, rows)
                times[k].append(time.perf_counter() - t)
        m, k, c = (statistics.median(times[k]) * 1e3 for k in arms)
        print(f"{rows:>5} {m:>15.2f} {k:>11.2f} {k / m:>7.3f} {c:>15.2f} {c / m:>7.3f}")


if __name__ == "__main__":
    main()
