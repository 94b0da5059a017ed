"""Time every registered estimator on a synthetic batch, against a Python-loop reference.

Default size: 4,096 groups x 16 rollouts x 1,024 tokens (one row per trajectory,
layout "turn" so turn-level estimators run too). Every estimator in ESTIMATORS is
timed through ``sparring.advantages.compute`` (advantages [n, T] and keep mask) with the
options in OPTIONS; one that raises on the synthetic batch is skipped with the reason.
Those with a reference in bench/loop_reference.py also get the loop's time, the
speed-up, and the largest difference between the two results.

    PYTHONPATH=src python bench/advantages.py                     # full size
    PYTHONPATH=src python bench/advantages.py --groups 64 --quick # smoke test
    PYTHONPATH=src python bench/advantages.py --thp               # huge pages

Memory: a fresh 65,536 x 1,024 float32 result is 256 MB, and faulting its pages in costs
more than the statistics of either side. ``--thp`` turns on PyTorch's huge-page CPU
allocator (``THP_MEM_ALLOC_ENABLE=1``, read once at torch's first large allocation, so it
is set before torch is imported) for the whole process, the loop reference included,
which shows the ratios without most of that cost. Both runs are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if __name__ == "__main__" and "--thp" in sys.argv:
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import torch  # noqa: E402

from loop_reference import LOOP_REFERENCES, writing_into  # noqa: E402
from sparring.advantages import ESTIMATORS, compute, list_estimators  # noqa: E402
from sparring.data import TurnBatch  # noqa: E402

# Options per estimator for the synthetic batch; add an entry when a new estimator
# needs one (estimators without an entry run with their defaults).
OPTIONS: dict[str, dict] = {
    "reinforce": {"baseline": 0.5},
    "a_grae": {"step": 10, "total_steps": 100},
    "ngrpo": {"max_reward": 1.0},
}


def synthetic_batch(groups: int, rollouts: int, T: int, turns: int = 1, agents: int = 1,
                    seed: int = 0, layout: str = "turn") -> TurnBatch:
    """A turn-layout batch with every field filled: binary returns with a per-group
    success rate, random lengths, anchor states that repeat within a group, entropies,
    values, reference log-probs and extras ``p_before``, ``p_after``, ``greedy_reward``
    (igpo, remax), ``match`` (matchtir) and ``q1``, ``q2``, ``v1``, ``v2`` (archer_targets)."""
    g = torch.Generator().manual_seed(seed)
    n_traj = groups * rollouts * agents
    traj = torch.arange(n_traj).repeat_interleave(turns)
    n = traj.numel()
    episode = traj // agents
    agent = traj % agents
    group = episode // rollouts
    turn = torch.arange(turns).repeat(n_traj)
    p = torch.rand(groups, generator=g)[group[::turns]]
    ret = (torch.rand(n_traj, generator=g) < p).float()[traj]
    length = torch.randint(max(T // 4, 1), T + 1, (n,), generator=g)
    mask = torch.arange(T)[None, :] < length[:, None]
    state = group * (2 * turns) + 2 * turn + torch.randint(0, 2, (n,), generator=g)
    greedy = (torch.rand(groups * rollouts, generator=g) < 0.5).float()[episode // rollouts * rollouts]

    def noise(scale: float) -> torch.Tensor:
        return torch.randn(n, T, generator=g) * scale * mask

    return TurnBatch(
        layout=layout, input_ids=torch.randint(0, 1000, (n, T), generator=g) * mask,
        attention_mask=mask.clone(), action_mask=mask, old_logp=-noise(1.0).abs(),
        group=group, episode=episode, agent=agent, turn=turn, step=turn * agents + agent,
        traj=traj, env_id=torch.zeros(n, dtype=torch.long), state_id=state,
        reward=torch.where(turn == turns - 1, ret, torch.zeros_like(ret)), returns=ret,
        last=turn == turns - 1, truncated=torch.zeros(n, dtype=torch.bool), length=length,
        env_names=["synthetic"], state_keys=[str(i) for i in range(int(state.max()) + 1)],
        extras={"p_before": torch.rand(n, generator=g), "p_after": torch.rand(n, generator=g),
                "greedy_reward": greedy[traj], "match": torch.rand(n, generator=g),
                **{k: torch.randn(n, generator=g) for k in ("q1", "q2", "v1", "v2")}},
        entropy=noise(1.0).abs(), ref_logp=-noise(1.0).abs(), values=noise(1.0),
    )


def best_time(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--groups", type=int, default=4096)
    ap.add_argument("--rollouts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--turns", type=int, default=1, help="rows per trajectory")
    ap.add_argument("--agents", type=int, default=1)
    ap.add_argument("--layout", choices=("turn", "trajectory"), default="turn",
                    help="layout tag of the batch (trajectory-only estimators need it)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N for the vectorised runs")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="1 repeat, 128 tokens: a smoke test")
    ap.add_argument("--no-loop", action="store_true", help="skip the loop references")
    ap.add_argument("--thp", action="store_true",
                    help="PyTorch's huge-page allocator (default: ordinary 4 KB pages)")
    a = ap.parse_args()
    if a.quick:
        a.repeat, a.tokens = 1, min(a.tokens, 128)
    torch.set_num_threads(a.threads)
    if a.layout == "trajectory" and a.turns != 1:
        ap.error("--layout trajectory needs --turns 1")
    batch = synthetic_batch(a.groups, a.rollouts, a.tokens, a.turns, a.agents, layout=a.layout)
    print(f"batch: {a.groups} groups x {a.rollouts} rollouts x {a.agents} agents x {a.turns} "
          f"turns = {batch.n_rows} rows x {a.tokens} tokens; torch {torch.__version__}, "
          f"{a.threads} threads, THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE')}")
    list_estimators()
    rows, skipped = [], []
    for e in ESTIMATORS:
        opts = OPTIONS.get(e.name, {})
        try:
            compute(e.name, batch, **opts)  # warm-up, and the skip test
        except Exception as exc:  # noqa: BLE001 - report and go on
            skipped.append((e.name, f"{type(exc).__name__}: {exc}"))
            continue
        sec = best_time(lambda n=e.name, o=opts: compute(n, batch, **o), a.repeat)
        loop_sec = diff = buf_sec = loop_buf_sec = None
        ref = LOOP_REFERENCES.get(e.name)
        if ref is not None and not a.no_loop:
            t0 = time.perf_counter()
            want = ref(batch, **opts)
            loop_sec = time.perf_counter() - t0
            diff = float((compute(e.name, batch, **opts)[0] - want).abs().max())
            # both sides again, each writing into its own preallocated [n, T] buffer
            del want
            buf = torch.zeros(batch.action_mask.shape)  # pages touched before timing
            buf_sec = best_time(lambda n=e.name, o=opts, b=buf: compute(n, batch, out=b, **o),
                                a.repeat)
            loop_buf = torch.zeros(batch.action_mask.shape)
            with writing_into(loop_buf):
                t0 = time.perf_counter()
                ref(batch, **opts)
                loop_buf_sec = time.perf_counter() - t0
            diff = max(diff, float((buf - loop_buf).abs().max()))
            del buf, loop_buf
        rows.append((e.name, e.family, sec, loop_sec, diff, buf_sec, loop_buf_sec))
    base = next((r[2] for r in rows if r[0] == "grpo"), None)
    print("fresh: each side allocates its [n, T] result; buffer: each writes into a "
          "preallocated one (compute(..., out=buf))")
    print(f"{'estimator':24} {'family':10} {'seconds':>9} {'x grpo':>7} {'loop s':>9} "
          f"{'speed-up':>9} {'buffer s':>9} {'loop buf s':>10} {'speed-up':>9} {'max |diff|':>10}")

    def col(x, fmt, width):
        return format(x, fmt) if x is not None else "-".rjust(width)

    for name, fam, sec, loop_sec, diff, buf_sec, loop_buf_sec in rows:
        ratio = f"{sec / base:7.2f}" if base else "      -"
        su = f"{loop_sec / sec:8.1f}x" if loop_sec is not None else "        -"
        sub = f"{loop_buf_sec / buf_sec:8.1f}x" if buf_sec else "        -"
        print(f"{name:24} {fam:10} {sec:9.4f} {ratio} {col(loop_sec, '9.3f', 9)} {su} "
              f"{col(buf_sec, '9.4f', 9)} {col(loop_buf_sec, '10.3f', 10)} {sub} "
              f"{col(diff, '10.1e', 10)}")
    for name, why in skipped:
        print(f"skipped {name}: {why}")


if __name__ == "__main__":
    main()
