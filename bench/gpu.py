"""GPU figures in one command: model throughput and recipe steps on a device.

    PYTHONPATH=src python bench/gpu.py --out OUT                      # on the GPU machine
    PYTHONPATH=src python bench/gpu.py --out OUT --cpu-steps-per-s default=0.9,kuhn_selfplay=1.2
    PYTHONPATH=src python bench/gpu.py --device cpu --quick --out OUT  # the CPU smoke test

Writes ``OUT/gpu.md`` (tables) and ``OUT/gpu.json`` (and ``OUT/tests.xml``, pytest's
report). Models are built from configs with random weights (so the GPU machine needs no network
and no SmolLM2 file; throughput does not depend on the weights):

0. **The device tests**: the suite's tests that take the ``device`` fixture (`DEVICE_TESTS`:
   the catalogue against the CPU, the learner, the sampler, mixed precision, every recipe's
   two steps, a checkpoint and resume) under ``SPARRING_TEST_DEVICE=<device>``, in a
   subprocess: passed, failed and skipped counts and the failing tests' names.
1. **Throughput** of a SmolLM2-135M-shaped and a Qwen2.5-0.5B-shaped model, bf16 autocast
   over float32 weights, the LM head in float32 (`sparring.policy.precision`, as
   ``model.precision: bf16-mixed``):
   sampling tokens/s (a batch prefilled once, then decoded one token a step with the KV
   cache, multinomial sampling), learner tokens/s (forward, backward and an AdamW step on
   a full batch), peak memory, and model FLOPs utilisation, ``6 N tokens/s`` (learner) or
   ``2 N tokens/s`` (sampling) over the card's dense bf16 peak (`PEAK_BF16`; "-" where the
   device is not in the table). ``N`` counts every parameter but the embedding table (the
   tied head's product is counted).
2. **Decoding** (`bench/decode.py`): the HF sampler's tokens a second with
   ``model.decode: dynamic`` and ``compiled`` (a static KV cache and a compiled decode
   step, a CUDA graph on a GPU) on the SmolLM2 shape, 64 prompts of 256 tokens and 128 new
   tokens each, and the share of rows whose tokens agree.
3. **Recipes**: the default recipe and ``kuhn_selfplay`` for ``--steps`` steps on the
   device (no evaluation, no checkpoints), steps/s; with ``--cpu-steps-per-s`` (measured on
   the CPU machine with ``--device cpu``) the device's speed-up over it.

Real-model training steps on the device are `bench/real_model.py --device cuda
--random-weights DIR` (SmolLM2's config and tokenizer only); docs/benchmarks.md "GPU
figures" has both scripts' tables from one H100.

``--quick`` shrinks everything (a tiny model shape, 3 recipe steps, no device tests and no
decoding part, which compiles) so
the suite can run the whole script on a CPU in seconds (tests/test_bench_gpu.py);
``--parts`` picks the parts to run. A part that raises is recorded with its error and the
others still run, so one broken path on the GPU costs no other figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import torch

# dense bf16 peak FLOP/s by device name fragment (NVIDIA's datasheets, SXM parts)
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}

SHAPES = {  # the real models' architectures (their config.json), random weights
    "smollm2-135m": dict(kind="llama", vocab_size=49152, hidden_size=576, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                         tie_word_embeddings=True),
    "qwen2.5-0.5b": dict(kind="qwen2", vocab_size=151936, hidden_size=896, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
                         tie_word_embeddings=True),
}
QUICK_SHAPE = dict(kind="llama", vocab_size=512, hidden_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                   tie_word_embeddings=True)
RECIPES = ("default", "kuhn_selfplay")
PARTS = ("tests", "throughput", "decode", "recipes")
ROOT = Path(__file__).resolve().parents[1]
DEVICE_TESTS = ("tests/test_on_device.py", "tests/test_train_learner.py",
                "tests/test_policy_hf.py", "tests/test_precision.py", "tests/test_recipes.py")


def device_tests(device: str, out: Path, timeout: float = 300) -> dict[str, Any]:
    """`DEVICE_TESTS` under ``SPARRING_TEST_DEVICE=device``: counts and failing names, from
    pytest's JUnit report ``out/tests.xml``."""
    report = out / "tests.xml"
    env = {**os.environ, "SPARRING_TEST_DEVICE": device,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT),
                                                        os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"--junitxml={report}", *DEVICE_TESTS], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    failed, counts = [], {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if report.exists():
        for suite in ET.parse(report).getroot().iter("testsuite"):
            for k in counts:
                counts[k] += int(suite.get(k, 0))
            for case in suite.iter("testcase"):
                if case.find("failure") is not None or case.find("error") is not None:
                    failed.append(f"{case.get('classname')}::{case.get('name')}")
    bad = counts["failures"] + counts["errors"]
    return {"device": device, "passed": counts["tests"] - bad - counts["skipped"],
            "failed": bad, "skipped": counts["skipped"], "failing": failed,
            "returncode": proc.returncode, "seconds": time.perf_counter() - t0,
            "tail": (proc.stdout + proc.stderr)[-3000:] if proc.returncode else ""}


def build_shaped(shape: dict[str, Any], device: str) -> torch.nn.Module:
    """A causal LM of ``shape`` with random weights, float32, on ``device``."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    kw = {k: v for k, v in shape.items() if k != "kind"}
    cls, cfg_cls = ((Qwen2ForCausalLM, Qwen2Config) if shape["kind"] == "qwen2"
                    else (LlamaForCausalLM, LlamaConfig))
    torch.manual_seed(0)
    return cls(cfg_cls(**kw, max_position_embeddings=4096)).to(device)


def non_embedding_params(model: torch.nn.Module) -> int:
    emb = model.get_input_embeddings().weight.numel()
    return sum(p.numel() for p in model.parameters()) - emb + (
        emb if model.config.tie_word_embeddings else 0)  # the tied head still multiplies


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_mib(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _mfu(flops_per_s: float, device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    return None if peak is None else flops_per_s / peak


@torch.no_grad()
def sampling_throughput(model: torch.nn.Module, device: str, batch: int, prompt: int,
                        new: int) -> float:
    """Tokens sampled a second: ``batch`` prompts of ``prompt`` tokens prefilled once, then
    ``new`` tokens each, one decode step at a time with the KV cache (after an untimed
    warm-up of the same shapes, so CUDA's start-up and kernel selection are not counted)."""
    from sparring.policy.precision import autocast_for

    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (batch, prompt), device=device)
    g = torch.Generator(device=device).manual_seed(0)

    def run(n: int) -> None:
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        cache, z = out.past_key_values, out.logits[:, -1]
        for _ in range(n):
            nxt = torch.multinomial(torch.softmax(z.float(), -1), 1, generator=g)
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            cache, z = out.past_key_values, out.logits[:, -1]

    with autocast_for(model):
        run(2)
        _sync(device)
        t0 = time.perf_counter()
        run(new)
        _sync(device)
    return batch * new / (time.perf_counter() - t0)


def learner_throughput(model: torch.nn.Module, device: str, batch: int, length: int,
                       steps: int) -> float:
    """Tokens a second through forward, backward and an AdamW step on ``batch`` rows of
    ``length`` tokens (the mean token log-prob as the loss), after one warm-up step."""
    from sparring.policy.precision import autocast_for

    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, model.config.vocab_size, (batch, length), device=device)
    elapsed = 0.0
    for i in range(steps + 1):
        _sync(device)
        t0 = time.perf_counter()
        with autocast_for(model):
            logits = model(input_ids=ids).logits[:, :-1].float()
        loss = -torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        if i:  # the first step is a warm-up
            elapsed += time.perf_counter() - t0
    return batch * length * steps / elapsed


def throughput_row(name: str, shape: dict[str, Any], device: str, quick: bool) -> dict[str, Any]:
    from sparring.policy import precision

    model = build_shaped(shape, device)
    precision.apply(model, "bf16-mixed")
    n = non_embedding_params(model)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    sb, sp, sn = (4, 16, 8) if quick else (64, 256, 128)
    lb, ll, ls = (4, 32, 2) if quick else (8, 1024, 5)
    sample = sampling_throughput(model, device, sb, sp, sn)
    learn = learner_throughput(model, device, lb, ll, ls)
    return {"model": name, "params_non_embedding": n, "sampling_tokens_per_s": sample,
            "learner_tokens_per_s": learn, "sampling_mfu": _mfu(2 * n * sample, device),
            "learner_mfu": _mfu(6 * n * learn, device), "peak_mib": _peak_mib(device),
            "sampling_batch": [sb, sp, sn], "learner_batch": [lb, ll]}


def decode_row(shape: str, device: str, quick: bool) -> dict[str, Any]:
    """`bench/decode.py` on ``shape``: 64 prompts of 256 tokens, 128 new (quick: 4 x 16, 8)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import decode

    batch, prompt, new, repeats = (4, 16, 8, 1) if quick else (64, 256, 128, 3)
    return decode.main(["--shape", shape, "--device", device, "--batch", str(batch),
                        "--prompt", str(prompt), "--new", str(new), "--repeats", str(repeats)])


def recipe_row(recipe: str, device: str, steps: int) -> dict[str, Any]:
    """``recipe`` for ``steps`` steps on ``device``: steps a second over the training loop
    (its first step included, the model's setup not), and the mean step's split after the
    first."""
    from sparring.assembly import build
    from sparring.config import find_recipe, load_config
    from sparring.train.loop import train

    folder = Path(tempfile.mkdtemp(prefix="sparring-gpu-"))
    cfg = load_config(find_recipe(recipe), [
        f"model.device={device}", f"train.steps={steps}", "eval.at_start=false",
        "eval.every=0", "eval.opponents=[]", "logging.progress=false", "checkpoint.every=0"])
    parts = build(cfg, folder)
    t0 = time.perf_counter()
    train(cfg, parts.model, parts.rollout_fn, None, parts.stateful, run_dir=folder / "run",
          pad_id=parts.pad_id)
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if "time/rollout" in r]
    timed = timed[1:] or timed  # step 1 warms up
    return {"recipe": recipe, "steps": steps, "steps_per_s": steps / wall,
            "rollout_s": sum(r["time/rollout"] for r in timed) / len(timed),
            "update_s": sum(r["time/update"] for r in timed) / len(timed)}


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def markdown(device_name: str, rows: list[dict], recipes: list[dict],
             tests: dict | None = None, errors: dict | None = None,
             decode: dict | None = None) -> str:
    out = [f"Device: {device_name}\n"]
    if tests is not None:
        out += [f"Device tests ({', '.join(DEVICE_TESTS)}): {tests['passed']} passed, "
                f"{tests['failed']} failed, {tests['skipped']} skipped in "
                f"{tests['seconds']:.0f} s" + "".join(f"\n- failed: {n}" for n in tests["failing"]),
                ""]
    out += ["| model (random weights) | params (non-embedding) | sampling tok/s | sampling MFU "
           "| learner tok/s | learner MFU | peak MiB |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['params_non_embedding'] / 1e6:.1f} M | "
                   f"{r['sampling_tokens_per_s']:.0f} | {_fmt(r['sampling_mfu'], '.1%')} | "
                   f"{r['learner_tokens_per_s']:.0f} | {_fmt(r['learner_mfu'], '.1%')} | "
                   f"{r['peak_mib']:.0f} |")
    if decode is not None:
        rate = decode["tokens_per_s"]
        out += ["", "| decoding (model.decode) | shape | batch | dynamic tok/s | compiled tok/s "
                "| compiled / dynamic | compile s | rows with equal tokens |",
                "|---|---|---|---|---|---|---|---|",
                f"| {decode['precision']} | {decode['shape']} | {decode['batch']} x "
                f"{decode['prompt']} + {decode['new']} | {rate['dynamic']:.0f} | "
                f"{rate['compiled']:.0f} | {decode['compiled_over_dynamic']:.2f} | "
                f"{decode['first_call_s']['compiled']:.0f} | "
                f"{decode['rows_with_equal_tokens']:.2f} |"]
    out += ["", "| recipe | steps | steps/s | rollout s | update s | vs CPU |",
            "|---|---|---|---|---|---|"]
    for r in recipes:
        out.append(f"| {r['recipe']} | {r['steps']} | {r['steps_per_s']:.2f} | "
                   f"{r['rollout_s']:.2f} | {r['update_s']:.2f} | "
                   f"{_fmt(r.get('speedup_vs_cpu'), '.2f')}{'x' if r.get('speedup_vs_cpu') else ''} |")
    for what, err in (errors or {}).items():
        out += ["", f"**{what} failed**: `{err.strip().splitlines()[-1]}`"]
    return "\n".join(out) + "\n"


def _cpu_figures(text: str | None) -> dict[str, float]:
    if not text:
        return {}
    out = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name not in RECIPES or not value:
            raise SystemExit(f"--cpu-steps-per-s: {item!r}; give RECIPE=STEPS_PER_S for "
                             f"{', '.join(RECIPES)}")
        out[name] = float(value)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for gpu.md and gpu.json")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, 3 recipe steps")
    ap.add_argument("--steps", type=int, default=50, help="recipe steps (default 50)")
    ap.add_argument("--cpu-steps-per-s", default=None,
                    help="the CPU machine's figures, e.g. default=0.9,kuhn_selfplay=1.2")
    ap.add_argument("--parts", default=None,
                    help=f"comma-separated, of {', '.join(PARTS)} (default: all; "
                         "--quick: throughput,recipes)")
    args = ap.parse_args(argv)
    cpu = _cpu_figures(args.cpu_steps_per_s)
    parts = (args.parts.split(",") if args.parts else
             [p for p in PARTS if not (args.quick and p in ("tests", "decode"))])
    if unknown := set(parts) - set(PARTS):
        raise SystemExit(f"--parts: unknown {', '.join(sorted(unknown))}; "
                         f"choose from {', '.join(PARTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    result: dict[str, Any] = {"device": name, "date": time.strftime("%Y-%m-%d"),
                              "throughput": [], "recipes": [], "errors": {}}

    def save() -> None:  # after every part: a run cut short still leaves what it measured
        (args.out / "gpu.json").write_text(json.dumps(result, indent=1))
        (args.out / "gpu.md").write_text(markdown(name, result["throughput"],
                                                  result["recipes"], result.get("tests"),
                                                  result["errors"], result.get("decode")))

    def attempt(what: str, fn, *a) -> Any:
        try:
            return fn(*a)
        except Exception:  # recorded, and the other parts still run
            result["errors"][what] = traceback.format_exc()
            print(result["errors"][what], file=sys.stderr)
            return None
        finally:
            save()

    if "tests" in parts:
        result["tests"] = attempt("tests", device_tests, args.device, args.out)
    if "throughput" in parts:
        shapes = {"quick": QUICK_SHAPE} if args.quick else SHAPES
        for shape_name, shape in shapes.items():
            row = attempt(shape_name, throughput_row, shape_name, shape, args.device, args.quick)
            if row is not None:
                result["throughput"].append(row)
    if "decode" in parts:
        row = attempt("decode", decode_row, "quick" if args.quick else "smollm2-135m",
                      args.device, args.quick)
        if row is not None:
            result["decode"] = row
    if "recipes" in parts:
        for recipe in RECIPES:
            row = attempt(recipe, recipe_row, recipe, args.device,
                          3 if args.quick else args.steps)
            if row is None:
                continue
            if recipe in cpu:
                row["speedup_vs_cpu"] = row["steps_per_s"] / cpu[recipe]
            result["recipes"].append(row)
    save()
    print((args.out / "gpu.md").read_text(), end="")
    return result


if __name__ == "__main__":
    main()
