"""torch.where(mask, x, 0) against rowblock.keep_where (bitwise AND with the mask's bits).

    PYTHONPATH=src python bench/masked_select.py

Two shapes, best of 200 (block) or 5 (full) runs each, in one process:
1. one 1 MB row block (255 x 1,024 float32), as the advantage code's row-blocked passes use;
2. the broadcast of 65,536 per-row values to 1,024 tokens (a trajectory estimator's
   output, 256 MB), fresh each time.
Both results are checked equal.
"""

from __future__ import annotations

import argparse
import time

import torch

from sparring.advantages.rowblock import keep_where


def best(fn, repeat: int) -> float:
    fn()
    t = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=65_536)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    zero = torch.zeros(())
    cases = []
    m = torch.rand(255, 1024, generator=g) < 0.7
    x = torch.randn(255, 1024, generator=g)
    cases.append(("1 MB block", m, x, 200))
    m = torch.rand(a.rows, 1024, generator=g) < 0.7
    x = torch.randn(a.rows, 1, generator=g)
    cases.append((f"{a.rows} x 1024 broadcast", m, x, 5))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name, m, x, rep in cases:
        assert torch.equal(torch.where(m, x, zero), keep_where(m, x))
        tw = best(lambda m=m, x=x: torch.where(m, x, zero), rep)
        tk = best(lambda m=m, x=x: keep_where(m, x), rep)
        print(f"{name:24} torch.where {tw * 1e3:9.3f} ms   keep_where {tk * 1e3:9.3f} ms   "
              f"ratio {tw / tk:5.1f}x")


if __name__ == "__main__":
    main()
