"""AdamW over a vocabulary-sized output layer of which a few rows train: torch's AdamW
against `RowSparseAdamW` (sparring.train.row_sparse_adamw), one after the other, same run.

    PYTHONPATH=src python bench/row_sparse_adamw.py              # SmolLM2's head, 12 rows
    PYTHONPATH=src python bench/row_sparse_adamw.py --rows 200 --steps 50

The matrix is SmolLM2-135M's output layer (49,152 x 576, float32), the gradient nonzero on
``--rows`` rows (a game's move tokens under constrained decoding: tic-tac-toe's nine cells
and the end-of-sequence token touch about a dozen). Prints milliseconds a step of each and
their ratio, and checks that both end with the same weights.
"""

from __future__ import annotations

import argparse
import time

import torch

from sparring.train.row_sparse_adamw import RowSparseAdamW


def timed(opt_cls, weight: torch.Tensor, grad: torch.Tensor, steps: int) -> tuple[float, torch.Tensor]:
    p = torch.nn.Parameter(weight.clone())
    extra = {"sparse": [p]} if opt_cls is RowSparseAdamW else {}
    opt = opt_cls([p], lr=1e-3, weight_decay=0.0, **extra)
    p.grad = grad
    opt.step()  # the state's first allocation is not timed
    start = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return (time.perf_counter() - start) / steps * 1e3, p.detach()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--rows", type=int, default=12)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(args.vocab, args.hidden, generator=g)
    grad = torch.zeros_like(weight)
    rows = torch.randperm(args.vocab, generator=g)[:args.rows]
    grad[rows] = torch.randn(args.rows, args.hidden, generator=g)
    full_ms, full = timed(torch.optim.AdamW, weight, grad, args.steps)
    sparse_ms, sparse = timed(RowSparseAdamW, weight, grad, args.steps)
    print(f"matrix {args.vocab} x {args.hidden}, {args.rows} rows with a gradient, "
          f"{args.steps} steps, {torch.get_num_threads()} threads")
    print(f"AdamW            {full_ms:8.2f} ms a step")
    print(f"RowSparseAdamW   {sparse_ms:8.2f} ms a step")
    print(f"same weights: {torch.equal(full, sparse)}")
    print(f"row-sparse step time: {sparse_ms / full_ms:.3f}x AdamW's")


if __name__ == "__main__":
    main()
