"""Scale-out: training steps/s of a recipe with 0, 1 and 2 Ray rollout workers.

    PYTHONPATH=src python bench/scale.py             # 2 warm-up + 8 timed steps per setting
    PYTHONPATH=src python bench/scale.py --quick     # 1 + 2 steps, to check the script works
    PYTHONPATH=src python bench/scale.py --recipe signalling_two_policies   # two policies
    PYTHONPATH=src python bench/scale.py --learner-ranks   # 1 and 2 torchrun learner ranks

Prints, from one run, for configs/default.yaml or ``--recipe`` (evaluation off, no
checkpoint but the last): steps/s over the timed steps (a step: its rollout and its update, as the training
loop times them; the workers' start and the warm-up steps are not counted), as a ratio to
the single-process run, with the rollout and update seconds per step and the rollout
tokens/s. Settings: 0 workers (rollouts in the training process), 1 and 2 workers
(``distributed.rollout_workers``, synchronous: the same metrics as 0), and 2 workers
asynchronous with ``max_staleness=1`` (rollouts of the next step overlap the update). Ray
runs locally with ``num_cpus`` = this machine's CPU count; each worker takes one CPU and
one torch thread, and so does the training process unless ``--threads`` says otherwise
(on a 2-core machine shared with other jobs, two torch threads made the default recipe's
step 15-20x slower: OpenMP threads waiting on each other).

``--learner-ranks``: instead, the recipe on 1 learner rank (``sparring train`` in one
process, one torch thread, then two) and on 2 (``torchrun --nproc-per-node=2``, gloo, one
thread each): the same steps/s, ratio and seconds per step. Two ranks of one thread and
one rank of two threads use the same cores: their ratio is what the ranks cost or gain.
Two last rows repeat 2 ranks with ``distributed.sharding=optimizer`` (a reduce and a
broadcast of the gradients' size per optimizer step where the unsharded ranks all-reduce)
and ``distributed.sharding=full`` (FSDP2: the weights gathered for every forward and
backward, the gradients reduce-scattered, the trained weights gathered whole after each
update); the table's last column is the optimizer state rank 0 holds
(``optimizer_state_mb``).

With the vLLM backend installed (``sparring.policy.vllm`` and the ``vllm`` package), a
``model.backend=vllm`` row (0 workers) is added, next to an HF row on the same model (two
heads: vLLM's CPU attention has no kernel for the default model's head size, 16), and then the sampling throughput of vLLM
against ``HFPolicy.generate`` on SmolLM2-135M (identical token-id prompts and sampling,
their ratio; `bench/vllm_throughput.py`, which needs the ``smollm2`` extra); without vLLM
the script says it skipped them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = [
    ("0 workers (single process)", []),
    ("1 worker, sync", ["distributed.rollout_workers=1"]),
    ("2 workers, sync", ["distributed.rollout_workers=2"]),
    ("2 workers, async (staleness 1)", ["distributed.rollout_workers=2",
                                        "distributed.mode=async",
                                        "distributed.max_staleness=1"]),
]


def run(overrides: list[str], warmup: int, steps: int, folder: Path,
        recipe: str = "default") -> dict[str, float]:
    """Train ``warmup + steps`` steps of ``recipe``; timings of the last ``steps``."""
    from sparring.assembly.run import build
    from sparring.config import find_recipe, load_config
    from sparring.train.loop import train

    cfg = load_config(find_recipe(recipe), [
        f"train.steps={warmup + steps}", "eval.at_start=false", "checkpoint.every=0",
        "logging.progress=false", *overrides])
    parts = build(cfg, folder)
    try:
        train(cfg, parts.model, parts.rollout_fn, None, parts.stateful, run_dir=folder,
              pad_id=parts.pad_id)
    finally:
        if hasattr(parts.rollout_fn, "close"):
            parts.rollout_fn.close()
    return timings(folder, warmup)


def run_ranks(ranks: int, warmup: int, steps: int, folder: Path, recipe: str,
              threads: int = 1, overrides: tuple[str, ...] = ()) -> dict[str, float]:
    """``sparring train RECIPE`` on ``ranks`` learner ranks (torchrun when more than one),
    ``threads`` torch threads each, with ``overrides``; timings of the last ``steps`` of
    ``warmup + steps``."""
    import socket
    import subprocess

    with socket.socket() as s:  # torchrun's rendezvous port: a free one, not 29500
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    head = ([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}",
             f"--master-port={port}", "-m", "sparring"] if ranks > 1
            else [sys.executable, "-m", "sparring"])
    cmd = [*head, "train", recipe, f"train.steps={warmup + steps}", "eval.at_start=false",
           "eval.every=0", "eval.games=10", "checkpoint.every=0", "logging.progress=false",
           f"train.run_dir={folder}", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return timings(folder, warmup)


def timings(folder: Path, warmup: int) -> dict[str, float]:
    """Steps/s, rollout and update seconds per step and rollout tokens/s over the steps of
    ``folder``'s metrics after ``warmup``."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if r["step"] > warmup and "time/rollout" in r]
    rollout = sum(r["time/rollout"] for r in timed) / len(timed)
    update = sum(r["time/update"] for r in timed) / len(timed)
    tokens = sum(r["throughput/tokens_per_s"] * r["time/rollout"] for r in timed)
    return {"steps_per_s": 1.0 / (rollout + update), "rollout_s": rollout, "update_s": update,
            "tokens_per_s": tokens / sum(r["time/rollout"] for r in timed),
            "reward": timed[-1]["reward"],
            "optimizer_mb": timed[-1].get("optimizer_state_mb", float("nan"))}


def learner_ranks(warmup: int, steps: int, recipe: str) -> None:
    """The ``--learner-ranks`` table: 1 and 2 ranks, and 2 with the optimizer state, then
    the weights, gradients and optimizer state sharded."""
    tmp = Path(tempfile.mkdtemp(prefix="sparring-ranks-"))
    try:
        results = []
        for k, (ranks, threads, sharding) in enumerate((
                (1, 1, "none"), (1, 2, "none"), (2, 1, "none"), (2, 1, "optimizer"),
                (2, 1, "full"))):
            over = () if sharding == "none" else (f"distributed.sharding={sharding}",)
            name = (f"{ranks} ({threads} thread{'s' if threads > 1 else ''} each)"
                    + ("" if sharding == "none" else f", `distributed.sharding={sharding}`"))
            t = time.perf_counter()
            res = run_ranks(ranks, warmup, steps, tmp / str(k), recipe, threads, over)
            print(f"  done: {name} ({time.perf_counter() - t:.0f} s with start-up)", flush=True)
            results.append((name, res))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_table("learner ranks", "1 rank, 1 thread", results, tokens=False, memory=True)


def print_table(first: str, base: str, results: list[tuple[Any, dict[str, float]]],
                tokens: bool = True, memory: bool = False) -> None:
    """The markdown table of ``results`` (``[(setting, timings)]``), steps/s as a ratio to
    the first setting's (``base``), with the rollout tokens/s when ``tokens`` and the
    optimizer state rank 0 holds when ``memory``."""
    cols = ["steps/s", f"vs {base}", "rollout s/step", "update s/step"]
    cols += ["rollout tokens/s"] if tokens else []
    cols += ["optimizer state, rank 0 (MiB)"] if memory else []
    print(f"\n| {first} | " + " | ".join(cols) + " |\n|" + "---|" * (len(cols) + 1))
    b = results[0][1]["steps_per_s"]
    for name, r in results:
        cells = [f"{r['steps_per_s']:.3f}", f"{r['steps_per_s'] / b:.2f}x",
                 f"{r['rollout_s']:.3f}", f"{r['update_s']:.3f}"]
        cells += [f"{r['tokens_per_s']:.0f}"] if tokens else []
        cells += [f"{r['optimizer_mb']:.2f}"] if memory else []
        print(f"| {name} | " + " | ".join(cells) + " |")


def vllm_available() -> str | None:
    """None when the vLLM backend can run here, else why not."""
    if importlib.util.find_spec("vllm") is None:
        return "the vllm package is not installed; SPARRING_EXTRAS=...,vllm bash scripts/setup.sh"
    try:
        import sparring.policy.vllm  # noqa: F401
    except ImportError as e:
        return f"sparring.policy.vllm does not import: {e}"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8, help="timed steps per setting")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per setting")
    ap.add_argument("--quick", action="store_true", help="1 warm-up and 2 timed steps")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the training process")
    ap.add_argument("--recipe", default="default",
                    help="a recipe in configs/ (signalling_two_policies: two policies)")
    ap.add_argument("--learner-ranks", action="store_true",
                    help="1 and 2 torchrun learner ranks instead of the worker settings")
    args = ap.parse_args()
    warmup, steps = (1, 2) if args.quick else (args.warmup, args.steps)
    if args.learner_ranks:
        print(f"configs/{args.recipe}.yaml, {warmup} warm-up + {steps} timed steps per "
              f"setting; {os.cpu_count()} CPUs, one torch thread per rank, gloo")
        learner_ranks(warmup, steps, args.recipe)
        return
    if importlib.util.find_spec("ray") is None:
        sys.exit("bench/scale.py needs Ray: pip install 'sparring[ray]'")
    import ray
    import torch

    cpus = os.cpu_count() or 1
    torch.set_num_threads(args.threads)
    print(f"configs/{args.recipe}.yaml, {warmup} warm-up + {steps} timed steps per setting; "
          f"{cpus} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads in the "
          "training process), Ray", ray.__version__)
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    settings = list(SETTINGS)
    why_not = vllm_available() if args.recipe == "default" else "the vLLM rows are the default recipe's"
    if why_not is None:
        # vLLM's CPU attention has no kernel for the default model's head size (16): both
        # backends on the model with 2 heads (head size 32), in one process
        two_heads = ["model.options.num_heads=2", "model.options.num_kv_heads=2"]
        settings += [("HF backend, 0 workers, 2 heads", two_heads),
                     ("vLLM backend, 0 workers, 2 heads", ["model.backend=vllm", *two_heads])]
    tmp = Path(tempfile.mkdtemp(prefix="sparring-scale-"))
    results = []
    try:
        for k, (name, overrides) in enumerate(settings):
            t = time.perf_counter()
            res = run(overrides, warmup, steps, tmp / str(k), args.recipe)
            res["wall_s"] = time.perf_counter() - t
            results.append((name, res))
            print(f"  done: {name} ({res['wall_s']:.0f} s with start-up)", flush=True)
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    print_table("setting", "0 workers", results)
    if why_not is not None:
        print(f"\nvLLM backend: skipped: {why_not}")
        return
    # sampling alone, on a real model: vLLM against HFPolicy.generate, same prompts/sampling
    sys.path.insert(0, str(Path(__file__).parent))
    from vllm_throughput import measure, print_figures

    torch.set_num_threads(cpus)
    print("\nSampling, vLLM backend against HFPolicy.generate (bench/vllm_throughput.py):")
    if args.quick:
        print_figures(measure(4, 8, 8, 1), 4, 8, 8)
    else:
        print_figures(measure(threads=cpus))


if __name__ == "__main__":
    main()
