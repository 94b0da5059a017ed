"""Bring a LoRA run back from a GPU machine: pack it there, unpack it here into a run folder
this machine can load (`bench/gpu_seeds.sh` packs each seed).

    python bench/gpu_pack.py pack RUN_DIR OUT/seed0.tar.gz         # on the GPU machine
    PYTHONPATH=src python bench/gpu_pack.py unpack OUT/seed0.tar.gz RUN_DIR
    sparring eval RUN_DIR --device cpu --vs random,minimax
    PYTHONPATH=src python bench/must_block.py RUN_DIR --device cpu

The archive holds the run's config, metrics and log and its last checkpoint's adapter in
bf16, so that it stays under 16 MiB: SmolLM2's rank-16 adapter on every projection is
19.6 MB in float32. The unpacked run has one checkpoint with that
adapter in float32 again (bf16-rounded: a relative change of at most 2^-9 a weight) and
no optimizer, league or RNG state: it loads for evaluation and play, and ``--resume``
refuses it (it holds no state for the learner)."""

from __future__ import annotations

import argparse
import io
import tarfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from sparring.train.checkpoint import latest_intact_checkpoint, save_checkpoint

ADAPTER = "adapter.bf16.safetensors"
CHECKPOINT_NAME = "checkpoint.txt"
RUN_FILES = ("run.log", "metrics.jsonl", "config.yaml")


def pack(run_dir: str | Path, archive: str | Path) -> Path:
    """Write ``archive`` (tar.gz) of ``run_dir``'s `RUN_FILES` (those present) and its last
    intact checkpoint's adapter in bf16."""
    run = Path(run_dir)
    ckpt = latest_intact_checkpoint(run)
    adapter = load_file(ckpt / "adapter.safetensors")
    members = {name: (run / name).read_bytes() for name in RUN_FILES if (run / name).exists()}
    members[ADAPTER] = save({k: v.to(torch.bfloat16) for k, v in adapter.items()})
    members[CHECKPOINT_NAME] = f"{ckpt.name}\n".encode()
    with tarfile.open(archive, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return Path(archive)


def unpack(archive: str | Path, run_dir: str | Path) -> Path:
    """Extract ``archive`` into a new ``run_dir`` with one policy-only checkpoint; its path."""
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=False)
    with tarfile.open(archive) as tar:
        tar.extractall(run, filter="data")
    step = int((run / CHECKPOINT_NAME).read_text().strip().removeprefix("step_"))
    adapter = load_file(run / ADAPTER)
    return save_checkpoint(run, step, weights={"adapter": {k: v.float() for k, v in adapter.items()}},
                           stateful={}, meta={"policy_only": "bench/gpu_pack.py: a bf16 adapter"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="RUN_DIR -> ARCHIVE (on the GPU machine)")
    p.add_argument("run_dir")
    p.add_argument("archive")
    u = sub.add_parser("unpack", help="ARCHIVE -> a new RUN_DIR (here)")
    u.add_argument("archive")
    u.add_argument("run_dir")
    args = ap.parse_args()
    if args.command == "pack":
        print(pack(args.run_dir, args.archive))
    else:
        print(unpack(args.archive, args.run_dir))


if __name__ == "__main__":
    main()
