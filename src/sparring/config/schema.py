"""What a run configuration is and how one is made: a dataclass per section with a help
string and bounds per field (`opt`), `Config` the whole run, and its constructors:
`from_dict` (defaults <- a mapping <- ``key.sub=value`` overrides, then `validate`),
`load_config` (a YAML file), `Config.load` (a recipe by name); `commented_yaml` writes
the defaults with their help (configs/reference.yaml)."""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from sparring.config.aliases import translate, translate_overrides
from sparring.config.checks import validate
from sparring.config.components import EXPLORERS
from sparring.config.files import find_recipe, read_yaml
from sparring.config.overrides import ConfigError, apply_override, build


def opt(default: Any, help: str, components: str = "", **check: float) -> Any:
    """A config field: default (a list/dict default is copied per instance), help, bounds.

    ``check`` may hold ``ge``, ``gt``, ``le``, ``lt`` numeric bounds enforced on load;
    ``components``: the kind of registered components the field lists (`commented_yaml`
    writes their options under it).
    """
    meta = {"help": help, **check, **({"components": components} if components else {})}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    if is_dataclass(default):
        return field(default_factory=lambda: type(default)(), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ModelConfig:
    name: str = opt("tiny", "'tiny' (the built-in tiny model), 'smollm2', a Hugging Face id or "
                    "a local path (a folder named like a built-in: ./tiny)")
    options: dict[str, Any] = opt({}, "constructor options (e.g. the tiny model's sizes)")
    dtype: Literal["float32", "bfloat16", "float16"] = opt(
        "float32", "dtype the weights are loaded in and trained in (bfloat16: pure "
        "low-precision weights, every update rounded to 8 mantissa bits)")
    precision: Literal["auto", "float32", "bf16-mixed"] = opt(
        "auto", "compute precision: 'bf16-mixed' runs matrix products in bf16 (autocast) over "
        "float32 weights and optimizer state, the LM head in float32; 'auto' picks it where "
        "the device has native bf16 (a CPU with AVX-512 BF16 or AMX and a model of 10 M "
        "parameters or more; a CUDA GPU and 1 B or more, below which casts and launches cost "
        "more than bf16 saves), else float32. The run prints what it chose")
    device: str = opt("cpu", "'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'")
    trust_remote_code: bool = opt(False, "allow model code from the hub (off unless you trust it)")
    head: dict[str, Any] = opt(
        {"name": "lm_head"}, "what of the model trains and what its output layer reads, a "
        "component {name: ..., option: value} (`sparring list heads`; "
        "sparring.policy.heads)", components="head")
    backend: Literal["hf", "vllm"] = opt(
        "hf", "what samples the learner's rollouts: 'hf' (transformers, the learner's own model) "
        "or 'vllm' (a vLLM engine in this process, given the learner's weights before each "
        "rollout; install with SPARRING_EXTRAS=...,vllm). Evaluation and opponents stay on hf")
    decode: Literal["dynamic", "compiled"] = opt(
        "dynamic", "how the hf backend decodes: 'dynamic', over a KV cache that grows a "
        "column a token and drops finished rows; 'compiled', over a preallocated (static) KV "
        "cache with a decode step compiled by torch.compile (a CUDA graph on a GPU): the "
        "same tokens with fewer kernel launches, after a compilation of tens of seconds per "
        "new batch shape (sparring.policy.decode_cache; bench/decode.py)")
    vllm_options: dict[str, Any] = opt(
        {}, "more vllm.LLM arguments with backend=vllm, e.g. {enforce_eager: true} (skips the "
        "compile warm-up), kv_cache_memory_bytes (CPU, default 1 GiB), gpu_memory_utilization "
        "(GPU, default 0.3), enable_lora: true (a LoRA run syncs its adapter alone each step, "
        "max_lora_rank defaulting to lora.r)")


@dataclass
class EnvSpec:
    name: str = opt("tictactoe", "environment name or alias (see `sparring list envs`)")
    options: dict[str, Any] = opt({}, "environment constructor options")
    weight: float = opt(1.0, "share of the step's episodes from this environment", ge=0)
    opponents: list[str] = opt([], "who plays the other seats: 'self', 'pool' or bot names "
                               "(`sparring list bots`)")
    group_size: int = opt(1, "episodes per group (same start state / prompt)", ge=1)
    estimator_options: dict[str, Any] = opt({}, "estimator options for this env's rows")
    starts: list[dict[str, Any]] = opt(
        [], "how a group of training episodes starts, a list of start components "
        "[{name: ..., option: value}, ...], each name at most once (`sparring list starts`; "
        "sparring.envs.starts); evaluation plays the plain game. []: the game's own start",
        components="start")
    learner_seats: list[int] = opt(
        [], "the learner's seat in games against bots or the pool, in turn: episode i of a "
        "group's run puts it in learner_seats[i % len]; repeat a seat to train it more "
        "(e.g. [0, 1, 1, 1]: the second seat three times as often as the first). []: every "
        "seat in turn. Self-play is unchanged")
    seats: list[str] = opt(
        [], "the policy (a name in `policies`) of each seat, one name per seat; with bot "
        "opponents the bot takes every seat but the rotating one, played by that seat's "
        "policy. [] without `policies`: the one policy plays every seat (required with them)")


@dataclass
class RolloutConfig:
    episodes_per_step: int = opt(64, "episodes collected per training step", ge=1,
                                 le=100_000)
    max_new_tokens: int = opt(8, "generation budget per turn", ge=1)
    answer_format: str = opt(
        "{}", "how the model writes a move in its answer, {} standing for the move: '{}' the "
        "bare move (constrained decoding), e.g. '<answer>{}</answer>' with free decoding. "
        "The exact evaluations (exploitability, exact rates against minimax) score each "
        "legal move written this way, so they measure what the model plays")
    answer_prefix: str = opt(
        "", "text every answer starts with, put at the end of the prompt after the chat "
        "template's generation prompt (a prefill): the model writes only what follows, e.g. "
        "'<answer>' with answer_format '<answer>{}</answer>' and stop '</answer>', so the "
        "opening tag is given and the move and the closing tag are the model's. It must "
        "start answer_format; the env parses the prefix plus what the model wrote")
    strict_format: bool = opt(
        False, "free decoding: an answer counts only when it is exactly answer_format around "
        "one move (whitespace aside), the move the env reads; anything else, e.g. a move "
        "named in prose or a missing tag, is an invalid answer (invalid_action decides what "
        "follows). Off: the env's own parser finds a move anywhere in the text")
    stop: list[str] = opt(
        [], "stop strings: free decoding ends a turn at the first one it generates (e.g. "
        "'</answer>'), as at EOS, instead of running to max_new_tokens; the stop string's "
        "tokens are part of the action and scored")
    temperature: float = opt(1.0, "sampling temperature (log-probs use the same)", gt=0)
    layout: Literal["turn", "trajectory"] = opt(
        "turn", "TurnBatch rows: one per turn or one per agent trajectory "
        "(an estimator that declares a layout overrides this)")
    history: Literal["full", "last_k", "state"] = opt(
        "full", "what a seat sees: the whole dialogue, the last k exchanges, or the current "
        "observation only")
    last_k: int = opt(2, "exchanges kept with history=last_k", ge=0)
    system_prompt: str | None = opt(
        None, "override every env's system prompt ('' drops it: tiny models learn the rules "
        "from play); null keeps the env's")
    max_prompt_tokens: int = opt(1024, "hard prompt limit; older context is cut (0: none)", ge=0)
    invalid_action: Literal["forfeit", "retry", "constrained"] = opt(
        "constrained", "illegal or unparsable moves: forfeit the game, retry with the error "
        "shown, or sample only legal actions (constrained decoding)")
    invalid_penalty: float = opt(-1.0, "reward added to a turn with an invalid action")
    max_retries: int = opt(2, "retries per move with invalid_action=retry", ge=0)
    max_turns: int = opt(200, "turn budget per episode (truncated beyond)", ge=1)


@dataclass
class ExplorationSpec:
    """How one kind of player explores (an entry of ``exploration``)."""

    rate: float = opt(
        0.0, "epsilon: at each of its turns the player plays a uniformly random legal move "
        "with this probability (in a free-text env under constrained decoding: begins its "
        "move with a uniformly random one of the env's action prefixes)", ge=0, le=1)
    schedule: Literal["constant", "cosine"] = opt(
        "constant", "rate over train.steps: constant, or a cosine from rate down to "
        "final_ratio * rate")
    final_ratio: float = opt(0.0, "final rate of the cosine schedule as a fraction of rate",
                             ge=0, le=1)
    turns: int = opt(
        0, "explore only at the player's first N turns of an episode (0: at every turn); "
        "its later moves are its policy's, so a line opened at random is followed up well",
        ge=0)
    tactical: bool = opt(
        False, "draw the random move among the moves a two-ply lookahead keeps (a win in one "
        "if there is one, else none that lets the next mover win at once): new positions "
        "without gifts (needs a game with clone() and no hidden chance)")


@dataclass
class LeagueConfig:
    every: int = opt(
        0, "add a snapshot of the policy to the opponent pool every N steps (0: never)", ge=0)
    max: int = opt(
        5, "past snapshots kept in the pool (the newest); RUN_DIR/pool holds at most "
        "league.max + 1 of them plus each kept checkpoint's pool (so every kept checkpoint "
        "can resume); the others are deleted", ge=1)
    cache: int = opt(
        0, "pool snapshots kept loaded in memory, the most recently drawn (0: all league.max; "
        "fewer saves memory with large models but reloads a snapshot from disk each time "
        "a draw misses)", ge=0)
    bots: list[str] = opt(["random"], "bots in the opponent pool besides snapshots")
    mode: Literal["uniform", "recency", "pfsp"] = opt(
        "recency", "how the pool samples: uniformly, favouring recent snapshots, or 'pfsp' "
        "(prioritised fictitious self-play): entry weight (1 - x) ** pfsp_power, x the "
        "learner's recent score against it (win 1, draw 1/2, loss 0), so the opponents it "
        "still loses to are met most")
    pfsp_power: float = opt(
        2.0, "mode=pfsp: the power p of (1 - x) ** p (larger: harder opponents only)", gt=0)
    score_rate: float = opt(
        0.5, "how fast the learner's score against a pool entry follows each step's games "
        "(exponential average; 1: the last step's only)", gt=0, le=1)


@dataclass
class KLConfig:
    coef: float = opt(0.0, "weight of the KL(policy || reference) loss term (0: off)", ge=0)
    estimator: Literal["k1", "k2", "k3"] = opt(
        "k3", "per-token KL estimator, r = pi / pi_ref: k1 = log r, k2 = (log r)^2 / 2, "
        "k3 = (1/r - 1) + log r")
    reference: Literal["initial", "magnet"] = opt(
        "initial", "'initial': the frozen starting model (base model with LoRA adapters off); "
        "'magnet': an exponential moving average of the policy's own weights (R-NaD / MMD)")
    magnet_rate: float = opt(0.01, "magnet EMA rate per update: m <- (1 - rate) m + rate w",
                             gt=0, le=1)


@dataclass
class ArcherConfig:
    gamma: float = opt(0.95, "discount per turn of the critic's TD target "
                       "Q <- r + gamma (1 - done) V_target(s')", ge=0, le=1)
    tau: float = opt(0.1, "Polyak rate of the target critic after each critic update: "
                     "target <- (1 - tau) target + tau online", gt=0, le=1)
    buffer_steps: int = opt(4, "replay buffer: the turns of the last N training steps", ge=1)
    updates: int = opt(4, "critic gradient updates per training step, each on a replay sample",
                       ge=1)
    batch_turns: int = opt(0, "turns sampled from the buffer per critic update (0: as many as "
                           "the newest step has)", ge=0)
    lr: float | None = opt(None, "critic learning rate (null: optim.lr)", gt=0)


@dataclass
class ImportanceCorrectionConfig:
    level: Literal["auto", "off", "token", "turn"] = opt(
        "auto", "reweight the advantages of samples drawn by another policy than the "
        "learner's by min(pi_learner / pi_behaviour, clip), per sampled token or per turn "
        "(the ratio of the turn's whole action). Two samplers differ from the learner: a "
        "rollout engine whose log-probs differ under the same weights (vLLM, another "
        "precision; needs algorithm.recompute_old_logp), and async rollout workers on "
        "older weights (distributed.mode async, the learner recomputing pi). 'auto': "
        "'token' for async workers, and for the sampler with model.backend vllm and "
        "recompute_old_logp; else off")
    clip: float = opt(2.0, "truncation c of the importance weights", gt=0)


@dataclass
class AlgorithmConfig:
    estimator: str = opt("grpo", "advantage estimator (see `sparring list estimators`)")
    estimator_options: dict[str, Any] = opt({}, "keyword options of the estimator")
    shaping: list[dict[str, Any]] = opt(
        [], "shapers in order, [{name: ..., options: {...}}, ...] (`sparring list shapers`): "
        "reward-level ones run before the estimator, advantage-level ones on its result, "
        "keep filters last")
    objective: str = opt("ppo_clip", "policy objective (see `sparring list objectives`)")
    objective_options: dict[str, Any] = opt({}, "keyword options of the objective")
    aggregation: str = opt("token-mean", "loss aggregation (see `sparring list aggregations`)")
    aggregation_norm: float | None = opt(
        None, "constant C of seq-mean-token-sum-norm (null: the batch's padded length)", gt=0)
    kl: KLConfig = opt(KLConfig(), "KL regularisation towards a reference policy")
    entropy_coef: float = opt(0.0, "entropy bonus weight (subtracted from the loss)", ge=0)
    entropy_bonus: Literal["entropy", "uniform_kl", "allowed_mass"] = opt(
        "entropy", "what entropy_coef weighs, per action token: 'entropy', H(pi); "
        "'uniform_kl', -KL(u || pi) with u uniform over the tokens constrained decoding "
        "allows there, a pull c (1/k - pi_a) on each logit that does not fade for a move "
        "the policy has given up, where the entropy's does; 'allowed_mass', the log of the "
        "probability the unconstrained policy puts on the tokens constrained decoding "
        "allows there (0 on free tokens), which teaches the model to write a legal move or "
        "an env's command word without the constraint (both need "
        "rollout.invalid_action=constrained; logged as uniform_kl or allowed_mass instead "
        "of entropy)")
    entropy_schedule: Literal["constant", "cosine"] = opt(
        "constant", "'constant'; 'cosine': the bonus decays from entropy_coef to "
        "entropy_final_ratio * entropy_coef over train.steps (explore early, settle late)")
    entropy_final_ratio: float = opt(0.0, "final entropy bonus of the cosine schedule as a "
                                     "fraction of entropy_coef", ge=0, le=1)
    entropy_warmup_steps: int = opt(
        0, "updates over which the bonus rises linearly to entropy_coef (update s weighs it "
        "by (s + 1) / W), before entropy_schedule takes over: a bonus on what the model "
        "writes (allowed_mass) that waits until the rewards have shaped what it does; 0: "
        "none", ge=0)
    entropy_target: float | None = opt(
        None, "hold the policy's token entropy (the logged `entropy`, nats per action token) "
        "near this value: the bonus starts at entropy_coef and after each update its log moves "
        "by entropy_target_rate * (target - entropy) / target (null: the bonus follows "
        "entropy_schedule)", gt=0)
    entropy_target_rate: float = opt(
        0.1, "step of log(bonus) per update when the entropy is 0 (entropy_target)", gt=0)
    recompute_old_logp: bool = opt(
        False, "recompute old log-probs with the current model before the update (with "
        "train.epochs 1 and one minibatch, the loss's own forward gives them)")
    importance_correction: ImportanceCorrectionConfig = opt(
        ImportanceCorrectionConfig(), "the truncated importance weight of samples another "
        "policy drew: a sampler whose log-probs differ from the learner's, rollout workers "
        "on older weights (sparring.importance)")


@dataclass
class CriticConfig:
    enabled: Literal["auto", "on", "off"] = opt(
        "auto", "train a value function: 'auto' when algorithm.estimator needs values (for "
        "archer_targets: ArCHer's utterance critic)")
    kind: Literal["head", "separate"] = opt(
        "head", "'head': a small MLP on the policy's last hidden state; 'separate': a copy "
        "of the initial model with its own head")
    hidden: int = opt(64, "hidden width of the value MLP", ge=1)
    coef: float = opt(0.5, "weight of the value loss", ge=0)
    target: Literal["returns", "advantages_plus_values"] = opt(
        "returns", "value regression target: the row's final return, or A + V (GAE returns)")
    archer: ArcherConfig = opt(ArcherConfig(), "ArCHer's utterance critic: twin Q/V heads, "
                               "target copies, replay (used with estimator archer_targets)")


@dataclass
class OptimConfig:
    lr: float = opt(1e-4, "peak learning rate", gt=0)
    betas: list[float] = opt([0.9, 0.999], "AdamW betas")
    eps: float = opt(1e-8, "AdamW epsilon", gt=0)
    weight_decay: float = opt(0.0, "AdamW weight decay", ge=0)
    schedule: Literal["constant", "warmup", "cosine"] = opt(
        "constant", "'constant'; 'warmup': linear warm-up then constant; "
        "'cosine': linear warm-up then cosine decay to lr_final_ratio * lr")
    warmup_steps: int = opt(0, "warm-up length in training steps", ge=0)
    lr_final_ratio: float = opt(0.0, "final lr of the cosine schedule as a fraction of lr",
                                ge=0, le=1)
    max_grad_norm: float | None = opt(1.0, "gradient clipping norm (null: no clipping)", gt=0)


@dataclass
class TrainConfig:
    steps: int = opt(100, "training steps (one rollout batch and one update each)", ge=1)
    epochs: int = opt(1, "passes over each batch", ge=1)
    minibatch_size: int = opt(0, "rows per optimizer step (0: the whole batch)", ge=0)
    microbatch_size: int = opt(0, "rows per forward/backward (0: the whole mini-batch)", ge=0)
    microbatch_tokens: int = opt(
        0, "padded tokens per forward/backward instead of microbatch_size rows: a "
        "mini-batch's rows sorted by length and cut so that each micro-batch's rows times "
        "its longest row stays within this (a longer row runs alone); the same loss and "
        "gradient, less padding where rows' lengths differ (multi-turn histories). 0: off",
        ge=0)
    minibatch_order: Literal["rows", "prompt"] = opt(
        "rows", "how an epoch cuts the batch into mini-batches: rows, a random permutation of "
        "the rows; prompt, the rows of one prompt kept together (the prompts in a random "
        "order), so a repeated row runs once an epoch under share_rows, and a shared prompt "
        "under share_prefix, instead of once in each mini-batch that holds one of them "
        "(fewer FLOPs where groups and games repeat moves; the rows that share a gradient "
        "step change)")
    share_rows: bool = opt(
        False, "run each distinct row (prompt and action) once per forward and give its "
        "log-probs to every row that repeats it (same loss and gradient to float rounding; "
        "pays where groups repeat moves: a game with few legal moves under constrained "
        "decoding). Off by default only so that earlier runs reproduce bit for bit")
    share_prefix: bool = opt(True, "run a prompt shared by several rows, and the start all "
                             "prompts share, once per forward (same loss and gradient, fewer "
                             "FLOPs; used when at most half the rows' prompts are distinct or "
                             "they share 8+ leading tokens)")
    seed: int = opt(0, "seed of python, numpy and torch", ge=0, le=2**32 - 1)
    deterministic: bool = opt(
        False, "torch's deterministic kernels (torch.use_deterministic_algorithms, warning "
        "where an op has none), for a GPU run, or a multi-threaded one, that must repeat bit "
        "for bit: the CPU kernel whose order varies on two threads is ordered without it "
        "(docs/reliability.md; its cost: bench/determinism.py)")
    max_skipped_updates: int = opt(
        5, "stop after this many consecutive updates skipped for non-finite values", ge=1)
    run_dir: str = opt("runs/{name}-{time}", "run folder ({name} and {time} are filled in)")
    name: str = opt("run", "run name")


@dataclass
class LoraConfig:
    enabled: bool = opt(False, "train LoRA adapters (PEFT) instead of all weights")
    r: int = opt(8, "LoRA rank", ge=1)
    alpha: float = opt(16.0, "LoRA alpha (scale alpha / r)", gt=0)
    dropout: float = opt(0.0, "LoRA dropout", ge=0, lt=1)
    target_modules: list[str] = opt(
        ["q_proj", "k_proj", "v_proj", "o_proj"], "module names that get adapters")
    last_layers: int = opt(
        0, "adapters only in the last N transformer layers (0: every layer). The layers "
        "below them are frozen, so the backward pass stops at the first adapted layer: "
        "an update costs less, at the price of adapting fewer weights", ge=0)
    shared_base: bool = opt(
        False, "with several `policies`: every policy is a LoRA adapter of its own on one "
        "frozen base model (one base in memory; peft multi-adapter), and so is each of its "
        "pool snapshots; false: each policy has its own copy of the model")


@dataclass
class PolicySpec:
    """One named policy of ``policies``: what differs from the top-level sections."""

    model: dict[str, Any] = opt({}, "keys of `model` that differ for this policy "
                                "(e.g. {options: {seed: 1}}); {}: the top-level model")
    optim: dict[str, Any] = opt({}, "keys of `optim` that differ (e.g. {lr: 3e-4})")
    lora: dict[str, Any] = opt({}, "keys of `lora` that differ (e.g. {r: 4})")
    algorithm: dict[str, Any] = opt(
        {}, "keys of `algorithm` that differ: estimator and its options, objective, "
        "entropy bonus, ... (e.g. {entropy_coef: 0.05}); the estimator's row layout "
        "(turn or trajectory) must be the same for every policy")
    kl: dict[str, Any] = opt({}, "keys of `algorithm.kl` that differ (e.g. {coef: 0.05}); "
                             "over those of `algorithm`")
    critic: dict[str, Any] = opt({}, "keys of `critic` that differ (e.g. {kind: separate})")


@dataclass
class EvalConfig:
    every: int = opt(0, "evaluate every N steps (0: only at the end)", ge=0)
    at_start: bool = opt(True, "also evaluate before the first update")
    games: int = opt(200, "games per (environment, opponent), the learner's seat rotating; "
                     "for a single-seat task, the held-out instances played", ge=1)
    opponents: list[str] = opt(["random"], "bots to evaluate against (`sparring list bots`)")
    greedy: bool = opt(True, "evaluate the greedy (argmax) policy rather than sampling")
    exploitability: bool = opt(True, "exact exploitability in games that declare their tree "
                               "(Kuhn and Leduc poker)")
    time_average: int = opt(
        10, "with exploitability: also that of the time-average strategy of the policies of "
        "the last N evaluations (<game>/exploitability_time_average: the reach-weighted "
        "average, i.e. a player that draws one of those snapshots per game; what converges "
        "in self-play when the last policy circles); 0: off", ge=0)
    average: bool = opt(True, "with a magnet KL reference, also the exact figures of the "
                        "magnet (the average policy): <game>/exploitability_average and "
                        "<game>/minimax_exact_average/...")
    free_text: bool = opt(
        False, "with rollout.invalid_action=constrained: also play each task's held-out "
        "instances with nothing constrained, an unreadable turn forfeiting (keys "
        "<task>/free_text/<metric>): whether the model writes the moves' format itself")
    self_play: bool = opt(False, "also let the policy play every seat of each game itself "
                          "(keys <game>/joint/...: mean score per seat, e.g. the success "
                          "rate of a cooperative game); always on with several `policies`")


@dataclass
class CheckpointConfig:
    every: int = opt(50, "checkpoint every N steps (0: only at the end and on a crash)", ge=0)
    keep: int = opt(3, "keep the last K checkpoints", ge=1)
    best_metric: str = opt(
        "", "also keep the checkpoint of the step where this logged metric was best so far, "
        "e.g. eval/leduc/exploitability (checkpoints/best.json names it; '': none)")
    best_mode: Literal["min", "max"] = opt("min", "best_metric: lower or higher is better")


@dataclass
class LoggingConfig:
    progress: bool = opt(True, "live progress bar with ETA and key metrics")
    tensorboard: bool = opt(False, "write TensorBoard events (needs `tensorboard`)")
    wandb: bool = opt(False, "log to Weights & Biases (needs `wandb`)")
    wandb_project: str = opt("sparring", "W&B project")
    keys: list[str] = opt(["reward", "loss", "kl", "entropy"], "metrics shown on the bar")


@dataclass
class DistributedConfig:
    rollout_workers: int = opt(
        0, "rollout workers as Ray actors, each with its own environments, share of the "
        "step's groups and policy backend; the learner stays in this process (0: rollouts "
        "run here; needs the ray extra: pip install 'sparring[ray]')", ge=0)
    mode: Literal["sync", "async"] = opt(
        "sync", "'sync': each step's rollouts use the newest weights (the same metrics as "
        "rollout_workers=0); 'async': workers run up to max_staleness steps ahead on older "
        "weights while the learner updates, with an importance correction "
        "(algorithm.importance_correction)")
    max_staleness: int = opt(
        1, "async: rollouts may come from weights up to this many updates old (their "
        "advantages reweighted as algorithm.importance_correction says)", ge=0)
    weight_sync: Literal["auto", "object_store", "collective"] = opt(
        "auto", "how new weights reach the workers: the Ray object store (one copy, "
        "fetched by each worker), a collective broadcast (NCCL on GPUs, gloo on CPUs), or "
        "auto: collective when the workers have GPUs, else the object store")
    address: str | None = opt(
        None, "Ray cluster to join: 'auto' (the one `ray start --head` started), "
        "'HOST:PORT' or 'ray://HOST:10001'; null: start Ray on this machine")
    worker_cpus: float = opt(1.0, "CPUs Ray reserves per rollout worker", gt=0)
    worker_gpus: float = opt(0.0, "GPUs per rollout worker (fractions share one GPU)", ge=0)
    max_restarts: int = opt(
        3, "dead rollout workers replaced per step before the step fails", ge=0)
    learner_ranks: int = opt(
        1, "data-parallel learner ranks: this process (rank 0: rollouts, evaluation, the run "
        "folder) and N-1 Ray actors that take part in every update; 1: this process alone "
        "(under torchrun the ranks are torchrun's: leave it at 1)", ge=1)
    sharding: Literal["none", "optimizer", "full"] = opt(
        "none", "what the learner ranks shard rather than each hold whole: 'none'; "
        "'optimizer': each rank keeps and steps the optimizer state of its own share of the "
        "weights only (about 1/N of AdamW's memory a rank; ZeRO stage 1); 'full': the "
        "update trains a copy of the model whose weights, gradients and optimizer state are "
        "sharded (FSDP2, ZeRO stage 3), rank 0 keeping the weights whole for sampling. "
        "Sharded, a checkpoint gathers the shards on rank 0, and a rank lost between two "
        "steps leaves no crash checkpoint (the last periodic one stands)")


@dataclass
class Config:
    model: ModelConfig = opt(ModelConfig(), "the policy model")
    envs: list[EnvSpec] = opt([], "environments of the run (mixed in one batch by weight)")
    policies: dict[str, PolicySpec] = opt(
        {}, "several policies in one run, by name (letters, digits, _ and -), each with its "
        "own model, optimizer, KL reference, estimator state, checkpoint weights and "
        "metrics (policy/NAME/...); envs[].seats says who plays which seat. {}: one policy "
        "plays every seat (self-play)")
    rollout: RolloutConfig = opt(RolloutConfig(), "rollout collection")
    league: LeagueConfig = opt(
        LeagueConfig(), "the opponent pool ('pool' in envs[].opponents): bots and past "
        "snapshots of the policy, how they are kept and drawn")
    exploration: dict[str, ExplorationSpec] = opt(
        {}, "random moves in training games, by who makes them: "
        + "; ".join(f"'{k}', {v}" for k, v in EXPLORERS.items())
        + ". {}: nobody explores (evaluation never does)")
    algorithm: AlgorithmConfig = opt(AlgorithmConfig(), "estimator, objective, regularisers")
    critic: CriticConfig = opt(CriticConfig(), "the value function (critic) the learner trains")
    optim: OptimConfig = opt(OptimConfig(), "optimizer and learning-rate schedule")
    train: TrainConfig = opt(TrainConfig(), "steps, epochs, batch sizes, seed")
    lora: LoraConfig = opt(LoraConfig(), "LoRA adapters")
    eval: EvalConfig = opt(EvalConfig(), "periodic evaluation")
    checkpoint: CheckpointConfig = opt(CheckpointConfig(), "checkpoints")
    logging: LoggingConfig = opt(LoggingConfig(), "metrics sinks and progress bar")
    distributed: DistributedConfig = opt(
        DistributedConfig(), "rollout workers on Ray (optional extra: pip install "
        "'sparring[ray]'; docs/cluster.md)")
    plugins: list[str] = opt(
        [], "modules (names or .py paths) imported before the config is checked: they "
        "register their own envs, estimators, objectives, shapers (sparring.plugins)")

    @classmethod
    def load(cls, name: str | Path | None = None,
             overrides: list[str] | tuple[str, ...] = ()) -> Config:
        """A recipe by name (``"kuhn_selfplay"``: configs/kuhn_selfplay.yaml, found as
        ``sparring train`` finds it) or a YAML path (None: the default run), plus
        ``key.sub=value`` overrides; checked."""
        return load_config(find_recipe(name), overrides)


def to_dict(cfg: Config) -> dict[str, Any]:
    return asdict(cfg)


def from_dict(data: dict[str, Any] | None, overrides: list[str] | tuple[str, ...] = (),
              check: bool = True) -> Config:
    """Defaults <- ``data`` <- ``overrides``, old keys read as the new ones (`aliases`);
    validated unless ``check=False``."""
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"a config file must hold a mapping, got {type(data).__name__}")
    items, old = translate_overrides(overrides)
    cfg = build(Config, translate(data or {}, old))
    for item in items:
        apply_override(cfg, item)
    from sparring.plugins import PluginError, import_plugins
    try:
        import_plugins(cfg.plugins)  # before the names they register are checked
    except PluginError as e:
        raise ConfigError(f"plugins: {e}") from None
    return validate(cfg) if check else cfg


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                check: bool = True) -> Config:
    """Defaults <- YAML file ``path`` <- ``overrides``; validated unless ``check=False``."""
    data = None if path is None else read_yaml(path)
    return from_dict(data, overrides, check)


def commented_yaml(cls: type = Config, indent: int = 0) -> str:
    """The defaults of ``cls`` as YAML with each field's help as a comment."""
    out, pad = [], " " * indent
    obj, hints = cls(), typing.get_type_hints(cls)
    for f in fields(cls):
        value = getattr(obj, f.name)
        out.append(f"{pad}# {f.metadata.get('help', '')}")
        if f.metadata.get("components"):  # the registered components and their options
            from sparring.config.components import describe
            out += [f"{pad}#   {line}" for line in describe(f.metadata["components"])]
        if is_dataclass(value):
            out.append(f"{pad}{f.name}:")
            out.append(commented_yaml(type(value), indent + 2))
        else:
            dumped = yaml.safe_dump({f.name: value}, default_flow_style=True, width=1000).strip()
            out.append(pad + dumped[1:-1] if dumped.startswith("{") else pad + dumped)
            item = typing.get_args(hints[f.name])[-1:]  # a list's or a named mapping's items
            if item and is_dataclass(item[0]):
                what = "each item" if typing.get_origin(hints[f.name]) is list else "each entry"
                out.append(f"{pad}#   {what}:")
                out += [f"{pad}#   {line}" for line in
                        commented_yaml(item[0], 2).splitlines()]
    return "\n".join(out)
