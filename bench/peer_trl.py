"""Sparring against Hugging Face TRL's ``GRPOTrainer`` on one identical GRPO workload.

    PYTHONPATH=src python bench/peer_trl.py            # 20 timed steps per side (+ warm-up)
    PYTHONPATH=src python bench/peer_trl.py --quick    # 3 steps per side: checks the script runs
    PYTHONPATH=src python bench/peer_trl.py --model smollm2   # the same workload on SmolLM2-135M
    PYTHONPATH=src python bench/peer_trl.py --update sampled-graph   # no learner forward

Needs TRL (a bench-only extra): ``pip install 'sparring[bench]'``.

Workload (both sides): a tiny Qwen2 (hidden 128, 2 layers, the character tokenizer of
`sparring.policy.tiny`), or with ``--model smollm2`` SmolLM2-135M-Instruct and its own
tokenizer (the smollm2 extra), built once and copied so both start from identical weights;
prompts ``a+b=`` over single digits a, b (100 prompts, shuffled per epoch with the same
seed by both sides, 32 per step); 8 samples per prompt, at most 4 new tokens,
temperature 1, no top-k/top-p; reward 1 if the completion starts with the sum, else 0.
GRPO advantages (R - mean_g R) / (std_g R + 1e-4), PPO-clip objective (eps 0.2, a single
update per batch so the ratio is 1), token-mean loss aggregation (TRL's ``dapo``), no
reference model (beta 0), AdamW lr 1e-3 constant, gradient clipping 1.0, CPU, fp32.

Sparring side: `HFPolicy.generate` (batched, KV cache), one `Episode`/`Turn` per sample,
`collate`, `advantages.compute("grpo")`, `Learner.update` (configured through `Config`).
With ``--update sampled-graph`` the sampler keeps its autograd graph
(`HFPolicy.generate_with_graph`) and the update back-propagates through the sampler's own
forward (`Learner.update`'s ``sampled_logp``) instead of running the learner's: the same
gradient (one optimizer step per batch), one forward fewer.
TRL side: ``GRPOTrainer.train()``; a callback runs a block of Sparring steps after every
block of TRL steps, so the two alternate in one process. A TRL step's time is the wall
time from the end of the previous callback to its ``on_step_end`` (data loading,
generation, reward, loss, backward, optimizer); a Sparring step's time is the whole
``step`` call. Warm-up steps are left out of the medians. Prints the per-step reward
curves of both sides and the ratio of median seconds per step (Sparring / TRL).

Arithmetic: each side's first warm-up step runs under torch's ``FlopCounterMode``, which
counts the floating-point operations of matrix products and attention, forward and
backward (elementwise work is not counted). The ratio of the two counts (Sparring / TRL)
is the time ratio a side would reach if both ran their products at the same rate: a time
ratio near it says Sparring's step is arithmetic, one well above it says overhead.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
import warnings

os.environ["HF_HUB_OFFLINE"] = "1"  # TRL must never reach for the network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from torch.utils.flop_counter import (  # noqa: E402
    FlopCounterMode,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from sparring.advantages import compute  # noqa: E402
from sparring.config import (  # noqa: E402
    AlgorithmConfig,
    Config,
    OptimConfig,
    RolloutConfig,
    TrainConfig,
)
from sparring.data import Episode, Turn, collate  # noqa: E402
from sparring.policy.hf import HFPolicy  # noqa: E402
from sparring.policy.sampling import SamplingParams  # noqa: E402
from sparring.policy.tiny import build_tokenizer  # noqa: E402
from sparring.train.learner import Learner  # noqa: E402
from sparring.train.sampled_graph import sampled_rows  # noqa: E402

PROMPTS_PER_STEP, GROUP, MAX_NEW, LR, CLIP, STD_EPS = 32, 8, 4, 1e-3, 0.2, 1e-4
PAIRS = [(a, b) for a in range(10) for b in range(10)]


def require_trl():
    """Import TRL and datasets, or exit with the install hint."""
    try:
        import datasets
        import trl
        from transformers import TrainerCallback
    except ImportError as e:
        sys.exit(f"bench/peer_trl.py needs TRL and datasets ({e}); "
                 "install them with: pip install 'sparring[bench]'")
    return trl, datasets, TrainerCallback


def build_model(seed: int, name: str = "tiny"):
    """The tiny Qwen2 and the character tokenizer (deterministic in ``seed``), or
    SmolLM2-135M-Instruct (``name='smollm2'``) and its tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if name == "smollm2":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from sparring.policy.smollm2 import smollm2_folder

        folder = smollm2_folder()
        tok = AutoTokenizer.from_pretrained(folder)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        return AutoModelForCausalLM.from_pretrained(folder).float().eval(), tok

    tok = build_tokenizer()
    cfg = Qwen2Config(
        vocab_size=len(tok), hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=384, max_position_embeddings=64,
        tie_word_embeddings=True, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
    return model.float().eval(), tok


def _cpu_attention(query, key, value, *_, out_shape=None, **__) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_attention_backward(grad_out, query, key, value, *_, out_shape=None, **__) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


# torch counts its CUDA attention kernels; the CPU's flash-attention kernel and its
# backward lead with the same arguments (shapes), so the same counts apply
CPU_ATTENTION_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_attention_backward,
}


def flop_counter() -> FlopCounterMode:
    """A counter of matrix-product and attention FLOPs, forward and backward, the CPU's
    attention kernels included."""
    return FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS)


def reward(completion: str, answer: str) -> float:
    return 1.0 if completion.startswith(answer) else 0.0


def prompt_stream(seed: int):
    """32 distinct pairs per step, the order TRL's ``RepeatSampler`` draws: a seeded
    permutation of the 100 prompts per epoch, cut into chunks of 32, the remainder dropped."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        perm = torch.randperm(len(PAIRS), generator=gen).tolist()
        for i in range(0, len(perm) - PROMPTS_PER_STEP + 1, PROMPTS_PER_STEP):
            yield [PAIRS[j] for j in perm[i:i + PROMPTS_PER_STEP]]


class SparringSide:
    """One GRPO step with Sparring's own components, sharing one model between sampler
    and learner (as `sparring.train` does)."""

    def __init__(self, model, tok, seed: int, steps: int, count_first: bool = False,
                 update: str = "learner"):
        self.tok = tok
        self.through_sampler = update == "sampled-graph"
        self.policy = HFPolicy(model, tok, seed=seed)
        self.sampling = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW)
        cfg = Config(
            rollout=RolloutConfig(max_new_tokens=MAX_NEW, temperature=1.0),
            algorithm=AlgorithmConfig(estimator="grpo", estimator_options={"eps": STD_EPS},
                                      objective="ppo_clip", objective_options={"eps_low": CLIP},
                                      aggregation="token-mean"),
            optim=OptimConfig(lr=LR, max_grad_norm=1.0, schedule="constant"),
            train=TrainConfig(steps=steps, epochs=1, seed=seed))
        self.learner = Learner(model, cfg)
        self.prompts = prompt_stream(seed)
        self.rewards: list[float] = []
        self.seconds: list[float] = []
        self.seen: list[list[str]] = []
        self.count_first = count_first  # the first step's FLOPs (module docstring)
        self.flops: int | None = None

    def step(self) -> None:
        if self.count_first and self.flops is None:
            with flop_counter() as counter:
                self._step()
            self.flops = counter.get_total_flops()
        else:
            self._step()

    def _step(self) -> None:
        t0 = time.perf_counter()
        pairs = next(self.prompts)
        texts = [f"{a}+{b}=" for a, b in pairs]
        ids = self.tok(texts)["input_ids"]  # tokenized as TRL does
        rows = [(g, k) for g in range(len(pairs)) for k in range(GROUP)]
        prompts = [ids[g] for g, _ in rows]
        if self.through_sampler:
            gens, token_logp = self.policy.generate_with_graph(prompts, self.sampling)
        else:
            gens = self.policy.generate(prompts, self.sampling)
        episodes = []
        for i, ((g, _), gen) in enumerate(zip(rows, gens)):
            a, b = pairs[g]
            r = reward(gen.text, str(a + b))
            turn = Turn(agent=0, prompt_ids=ids[g], action_ids=gen.token_ids,
                        logprobs=gen.logprobs, reward=r, done=True, action_text=gen.text)
            episodes.append(Episode(env="addition", seed=i, group=g, num_agents=1,
                                    turns=[turn], returns=[r]))
        batch = collate(episodes, layout="trajectory", pad_id=self.tok.pad_token_id)
        adv, keep = compute("grpo", batch, eps=STD_EPS)
        sampled = None
        if self.through_sampler:
            lengths = torch.tensor([len(g.token_ids) for g in gens])
            sampled = sampled_rows(batch.action_mask, token_logp, lengths)
        self.learner.update(batch, adv, keep, sampled_logp=sampled)
        self.seconds.append(time.perf_counter() - t0)
        self.rewards.append(float(batch.returns.mean()))
        self.seen.append(texts)


def run(steps: int, warmup: int, block: int, seed: int, threads: int | None,
        model_name: str = "tiny", update: str = "learner") -> None:
    trl, datasets, TrainerCallback = require_trl()
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers 5 renames
    if threads:
        torch.set_num_threads(threads)
    model, tok = build_model(seed, model_name)
    trl_model, sp_model = model, copy.deepcopy(model)
    sd1, sd2 = trl_model.state_dict(), sp_model.state_dict()
    assert all(torch.equal(sd1[k], sd2[k]) for k in sd1), "initial weights differ"
    total = steps + warmup
    sparring = SparringSide(sp_model, tok, seed, total, count_first=warmup > 0, update=update)

    trl_rewards: list[float] = []
    trl_seen: list[list[str]] = []

    def addition_reward(prompts, completions, answer, **_):
        r = [reward(c, a) for c, a in zip(completions, answer)]
        trl_rewards.append(sum(r) / len(r))
        trl_seen.append(list(dict.fromkeys(prompts)))
        return r

    class Alternate(TrainerCallback):
        """Times TRL steps; after every ``block`` of them runs as many Sparring steps."""

        def __init__(self):
            self.seconds: list[float] = []
            self.t = 0.0
            self.counter: FlopCounterMode | None = None
            self.flops: int | None = None  # of TRL's first step (module docstring)

        def on_train_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_begin(self, args, state, control, **kw):
            if warmup and self.flops is None and self.counter is None:
                self.counter = flop_counter()
                self.counter.__enter__()

        def on_step_end(self, args, state, control, **kw):
            if self.counter is not None:
                self.counter.__exit__(None, None, None)
                self.flops, self.counter = self.counter.get_total_flops(), None
            self.seconds.append(time.perf_counter() - self.t)
            if state.global_step % block == 0:
                for _ in range(block):
                    sparring.step()
            self.t = time.perf_counter()

    ds = datasets.Dataset.from_list([{"prompt": f"{a}+{b}=", "answer": str(a + b)}
                                     for a, b in PAIRS])
    with tempfile.TemporaryDirectory() as out:
        args = trl.GRPOConfig(
            output_dir=out, max_steps=total, per_device_train_batch_size=PROMPTS_PER_STEP * GROUP,
            gradient_accumulation_steps=1, num_generations=GROUP, max_completion_length=MAX_NEW,
            temperature=1.0, top_p=1.0, top_k=0, beta=0.0, num_iterations=1, epsilon=CLIP,
            loss_type="dapo", scale_rewards="group", learning_rate=LR,
            lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
            use_cpu=True, bf16=False, fp16=False, report_to="none", logging_strategy="no",
            save_strategy="no", disable_tqdm=True, log_completions=False, seed=seed,
            data_seed=seed, dataloader_num_workers=0)
        cb = Alternate()
        trainer = trl.GRPOTrainer(model=trl_model, reward_funcs=[addition_reward], args=args,
                                  train_dataset=ds, processing_class=tok, callbacks=[cb])
        trainer.train()
    while len(sparring.seconds) < total:  # the last, partial block
        sparring.step()
    report(cb.seconds, trl_rewards, trl_seen, sparring, warmup, trl.__version__, model_name,
           cb.flops, update)


def report(trl_s, trl_r, trl_seen, sp, warmup: int, trl_version: str,
           model_name: str = "tiny", trl_flops: int | None = None,
           update: str = "learner") -> None:
    import transformers

    n = len(sp.seconds)
    if len(trl_s) != n or len(trl_r) != n:
        sys.exit(f"step count mismatch: TRL timed {len(trl_s)} steps and scored {len(trl_r)} "
                 f"batches, Sparring ran {n}")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl_version}, "
          f"{torch.get_num_threads()} threads; model {model_name}, float32; "
          f"Sparring's update: {update}; "
          f"{PROMPTS_PER_STEP} prompts x {GROUP} samples, "
          f"<= {MAX_NEW} new tokens; warm-up steps {warmup} (marked *)")
    print(f"{'step':>5} {'TRL s':>7} {'Spar s':>7} {'TRL reward':>11} {'Spar reward':>12}")
    for i in range(n):
        mark = "*" if i < warmup else " "
        print(f"{i + 1:>4}{mark} {trl_s[i]:7.3f} {sp.seconds[i]:7.3f} {trl_r[i]:11.3f} "
              f"{sp.rewards[i]:12.3f}")
    t_med = statistics.median(trl_s[warmup:])
    s_med = statistics.median(sp.seconds[warmup:])
    same = sum(sorted(a) == sorted(b) for a, b in zip(sp.seen, trl_seen))
    k = max(1, (n - warmup) // 4)
    print(f"same prompts in {same}/{n} steps")
    print(f"mean reward, first {k} / last {k} steps: TRL {sum(trl_r[:k]) / k:.3f} -> "
          f"{sum(trl_r[-k:]) / k:.3f}; Sparring {sum(sp.rewards[:k]) / k:.3f} -> "
          f"{sum(sp.rewards[-k:]) / k:.3f}")
    print(f"median s/step over {n - warmup} steps: TRL {t_med:.4f}, Sparring {s_med:.4f}")
    print(f"ratio Sparring / TRL = {s_med / t_med:.3f}")
    if trl_flops and sp.flops:
        print(f"FLOPs of the first step (products and attention): TRL {trl_flops / 1e9:.2f} G, "
              f"Sparring {sp.flops / 1e9:.2f} G; ratio Sparring / TRL = "
              f"{sp.flops / trl_flops:.3f}; achieved GFLOP/s at the median step: "
              f"TRL {trl_flops / t_med / 1e9:.1f}, Sparring {sp.flops / s_med / 1e9:.1f}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20, help="timed steps per side (after warm-up)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps per side, not timed")
    p.add_argument("--block", type=int, default=2, help="steps per side before switching")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--quick", action="store_true", help="3 steps per side (1 warm-up)")
    p.add_argument("--model", choices=("tiny", "smollm2"), default="tiny",
                   help="the tiny Qwen2 (default) or SmolLM2-135M-Instruct (smollm2 extra)")
    p.add_argument("--update", choices=("learner", "sampled-graph"), default="learner",
                   help="Sparring's update: the learner's own forward (default), or "
                        "back-propagating through the sampler's (module docstring)")
    a = p.parse_args(argv)
    if a.quick:
        a.steps, a.warmup, a.block = 2, 1, 1
    if a.steps < 1 or a.warmup < 0 or a.block < 1:
        p.error("--steps and --block must be >= 1, --warmup >= 0")
    run(a.steps, a.warmup, a.block, a.seed, a.threads, a.model, a.update)


if __name__ == "__main__":
    main()
