"""Run configuration: dataclasses with a help string per field, YAML + ``key.sub=value``.

`load_config(path, overrides)` builds a `Config` from defaults, an optional YAML file and
command-line overrides (``algorithm.kl.coef=0.05``, ``envs.0.weight=2``,
``algorithm.estimator_options.eps=1e-3``); values are parsed with the field's type.
Unknown keys and bad values raise `ConfigError` naming the key, with a "did you mean"
hint and the allowed values. Registry-backed names (estimator, objective, aggregation,
environment) are checked against their registries by `validate`.

Several policies: ``policies`` names them (`PolicySpec`: the keys of ``model``, ``optim``,
``lora`` and ``algorithm.kl`` that differ for one) and ``envs[].seats`` maps seats to them;
`policy_config(cfg, name)` is the config a policy's model and learner are built from.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from sparring.train.overrides import ConfigError, apply_override, build, did_you_mean


def opt(default: Any, help: str, **check: float) -> Any:
    """A config field: default (a list/dict default is copied per instance), help, bounds.

    ``check`` may hold ``ge``, ``gt``, ``le``, ``lt`` numeric bounds enforced on load.
    """
    meta = {"help": help, **check}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    if is_dataclass(default):
        return field(default_factory=lambda: type(default)(), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ModelConfig:
    name: str = opt("tiny", "'tiny' (the built-in tiny model) or a Hugging Face id / local path")
    options: dict[str, Any] = opt({}, "constructor options (e.g. the tiny model's sizes)")
    dtype: Literal["float32", "bfloat16", "float16"] = opt(
        "float32", "dtype the weights are loaded in and trained in (bfloat16: pure "
        "low-precision weights, every update rounded to 8 mantissa bits)")
    precision: Literal["auto", "float32", "bf16-mixed"] = opt(
        "auto", "compute precision: 'bf16-mixed' runs matrix products in bf16 (autocast) over "
        "float32 weights and optimizer state, the LM head in float32; 'auto' picks it where "
        "the device has native bf16 (CUDA, a CPU with AVX-512 BF16 or AMX) and the model has "
        "10 M parameters or more, else float32. The run prints what it chose")
    device: str = opt("cpu", "'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'")
    trust_remote_code: bool = opt(False, "allow model code from the hub (off unless you trust it)")
    backend: Literal["hf", "vllm"] = opt(
        "hf", "what samples the learner's rollouts: 'hf' (transformers, the learner's own model) "
        "or 'vllm' (a vLLM engine in this process, given the learner's weights before each "
        "rollout; install with SPARRING_EXTRAS=...,vllm). Evaluation and opponents stay on hf")
    vllm_options: dict[str, Any] = opt(
        {}, "more vllm.LLM arguments with backend=vllm, e.g. {enforce_eager: true} (skips the "
        "compile warm-up), kv_cache_memory_bytes (CPU, default 1 GiB), gpu_memory_utilization "
        "(GPU, default 0.3)")


@dataclass
class EnvSpec:
    name: str = opt("tictactoe", "environment name or alias (see `sparring list envs`)")
    options: dict[str, Any] = opt({}, "environment constructor options")
    weight: float = opt(1.0, "share of the step's episodes from this environment", ge=0)
    opponents: list[str] = opt([], "who plays the other seats: 'self', 'pool' or bot names "
                               "(`sparring list bots`)")
    group_size: int = opt(1, "episodes per group (same start state / prompt)", ge=1)
    estimator_options: dict[str, Any] = opt({}, "estimator options for this env's rows")
    opening_moves: int = opt(
        0, "exploring starts: each group of training episodes begins after n random legal "
        "moves, n uniform in 0..opening_moves (never a move that ends the game; games that "
        "pay at the end; evaluation plays the plain game)", ge=0)
    symmetric_views: bool = opt(
        False, "each seat sees the board through its own random symmetry of the game "
        "(drawn per episode from its reset seed; the game must declare its symmetries, as "
        "tictactoe and connect_four do), so self-play meets its lines in every orientation; "
        "training only, evaluation plays the plain game")
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
    episodes_per_step: int = opt(64, "episodes collected per training step", ge=1)
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
    pool_every: int = opt(
        0, "add a snapshot of the policy to the opponent pool every N steps (0: never)", ge=0)
    pool_max: int = opt(
        5, "past snapshots kept in the pool (the newest); RUN_DIR/pool holds at most "
        "pool_max + 1 of them plus those taken since the oldest kept checkpoint's pool "
        "(so every kept checkpoint can resume); older ones are deleted", ge=1)
    pool_cache: int = opt(
        0, "pool snapshots kept loaded in memory, the most recently drawn (0: all pool_max; "
        "fewer saves memory with large models but reloads a snapshot from disk each time "
        "a draw misses)", ge=0)
    pool_bots: list[str] = opt(["random"], "bots in the opponent pool besides snapshots")
    pool_explore: float = opt(
        0.0, "epsilon of the pool's snapshots: at each of their moves they play a uniformly "
        "random legal move with this probability (opponent exploration: the learner meets "
        "positions its past selves would not reach, then their follow-up play)", ge=0, le=1)
    pool_explore_schedule: Literal["constant", "cosine"] = opt(
        "constant", "pool_explore over train.steps: constant, or a cosine from pool_explore "
        "down to pool_explore_final_ratio * pool_explore (wide coverage early; late, "
        "opponents that punish the moves which only pay against a random mover)")
    pool_explore_final_ratio: float = opt(
        0.0, "final epsilon of the cosine pool_explore_schedule as a fraction of "
        "pool_explore", ge=0, le=1)
    pool_explore_turns: int = opt(
        0, "a snapshot explores only at its first N turns of an episode (0: at every turn); "
        "its later moves are its policy's, so a line opened at random is followed up well",
        ge=0)
    pool_explore_tactical: bool = opt(
        False, "a snapshot's random move is drawn among the moves a two-ply lookahead keeps "
        "(a win in one if there is one, else none that lets the next mover win at once): new "
        "positions without gifts, so a move that only pays against an opponent who misses a "
        "block stops paying (needs a game with clone() and no hidden chance)")
    pool_temperature: float = opt(
        0.0, "sampling temperature of the pool's snapshots (0: rollout.temperature); above "
        "it, opponents that spread their play over the moves they rate well", ge=0)
    pool_mode: Literal["uniform", "recency", "pfsp"] = opt(
        "recency", "how the pool samples: uniformly, favouring recent snapshots, or 'pfsp' "
        "(prioritised fictitious self-play): entry weight (1 - x) ** pool_pfsp_power, x the "
        "learner's recent score against it (win 1, draw 1/2, loss 0), so the opponents it "
        "still loses to are met most")
    pool_pfsp_power: float = opt(
        2.0, "pool_mode=pfsp: the power p of (1 - x) ** p (larger: harder opponents only)", gt=0)
    pool_score_rate: float = opt(
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
    entropy_schedule: Literal["constant", "cosine"] = opt(
        "constant", "'constant'; 'cosine': the bonus decays from entropy_coef to "
        "entropy_final_ratio * entropy_coef over train.steps (explore early, settle late)")
    entropy_final_ratio: float = opt(0.0, "final entropy bonus of the cosine schedule as a "
                                     "fraction of entropy_coef", ge=0, le=1)
    value: Literal["auto", "on", "off"] = opt(
        "auto", "train a value function: 'auto' when the estimator needs values (for "
        "archer_targets: ArCHer's utterance critic)")
    critic: Literal["head", "separate"] = opt(
        "head", "'head': a small MLP on the policy's last hidden state; 'separate': a copy "
        "of the initial model with its own head")
    value_coef: float = opt(0.5, "weight of the value loss", ge=0)
    value_target: Literal["returns", "advantages_plus_values"] = opt(
        "returns", "value regression target: the row's final return, or A + V (GAE returns)")
    value_hidden: int = opt(64, "hidden width of the value MLP", ge=1)
    recompute_old_logp: bool = opt(
        False, "recompute old log-probs with the current model before the update (with "
        "train.epochs 1 and one minibatch, the loss's own forward gives them)")
    sampler_correction: Literal["off", "token", "turn"] = opt(
        "off", "with recompute_old_logp: reweight the advantages by the truncated "
        "importance weight min(pi_learner / pi_sampler, sampler_correction_clip) per sampled "
        "token or per turn, for a sampler whose log-probs differ from the learner's under "
        "the same weights (vLLM, another precision; sparring.importance)")
    sampler_correction_clip: float = opt(2.0, "truncation c of sampler_correction's weights",
                                         gt=0)
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
        "'cosine': linear warm-up then cosine decay to min_lr_ratio * lr")
    warmup_steps: int = opt(0, "warm-up length in training steps", ge=0)
    min_lr_ratio: float = opt(0.0, "final lr of the cosine schedule as a fraction of lr",
                              ge=0, le=1)
    max_grad_norm: float | None = opt(1.0, "gradient clipping norm (null: no clipping)", gt=0)


@dataclass
class TrainConfig:
    steps: int = opt(100, "training steps (one rollout batch and one update each)", ge=1)
    epochs: int = opt(1, "passes over each batch", ge=1)
    minibatch_size: int = opt(0, "rows per optimizer step (0: the whole batch)", ge=0)
    microbatch_size: int = opt(0, "rows per forward/backward (0: the whole mini-batch)", ge=0)
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
    shared_base: bool = opt(
        False, "with several `policies`: every policy is a LoRA adapter of its own on one "
        "frozen base model (one base in memory; peft multi-adapter); false: each policy has "
        "its own copy of the model")


@dataclass
class PolicySpec:
    """One named policy of ``policies``: what differs from the top-level sections."""

    model: dict[str, Any] = opt({}, "keys of `model` that differ for this policy "
                                "(e.g. {options: {seed: 1}}); {}: the top-level model")
    optim: dict[str, Any] = opt({}, "keys of `optim` that differ (e.g. {lr: 3e-4})")
    lora: dict[str, Any] = opt({}, "keys of `lora` that differ (e.g. {r: 4})")
    algorithm: dict[str, Any] = opt(
        {}, "keys of `algorithm` that differ: estimator and its options, objective, "
        "entropy bonus, critic, ... (e.g. {entropy_coef: 0.05}); the estimator's row layout "
        "(turn or trajectory) must be the same for every policy")
    kl: dict[str, Any] = opt({}, "keys of `algorithm.kl` that differ (e.g. {coef: 0.05}); "
                             "over those of `algorithm`")


@dataclass
class EvalConfig:
    every: int = opt(0, "evaluate every N steps (0: only at the end)", ge=0)
    at_start: bool = opt(True, "also evaluate before the first update")
    games: int = opt(200, "games per (environment, opponent), the learner's seat rotating", ge=1)
    opponents: list[str] = opt(["random"], "bots to evaluate against (`sparring list bots`)")
    greedy: bool = opt(True, "evaluate the greedy (argmax) policy rather than sampling")
    exploitability: bool = opt(True, "exact exploitability in games that declare their tree "
                               "(Kuhn and Leduc poker)")
    exact_vs_minimax: bool = opt(
        True, "with minimax among the opponents: also the exact rates against it over its "
        "random tie-breaks, and the positions where the policy plays a losing move (keys "
        "<game>/minimax_exact/...; the greedy policy, else its distribution at temperature 1)")
    average: bool = opt(True, "with a magnet KL reference, also the exact figures of the "
                        "magnet (the average policy): <game>/exploitability_average and "
                        "<game>/minimax_exact_average/...")
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
        "weights while the learner updates, with an importance correction")
    max_staleness: int = opt(
        1, "async: rollouts may come from weights up to this many updates old", ge=0)
    correction: Literal["token", "turn", "off"] = opt(
        "token", "async: multiply the advantages by truncated importance weights "
        "min(pi_old / pi_behaviour, correction_clip), pi_old recomputed by the learner, "
        "pi_behaviour recorded at sampling: per token, or per turn (the ratio of the turn's "
        "whole action), or off")
    correction_clip: float = opt(2.0, "async: truncation c of the importance weights", gt=0)
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
    algorithm: AlgorithmConfig = opt(AlgorithmConfig(), "estimator, objective, regularisers")
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


# ---------------------------------------------------------------- validation, I/O


def _registry_check(kind: str, name: str, key: str) -> None:
    from sparring.registry import UnknownNameError
    try:
        if kind == "estimator":
            from sparring.advantages import ESTIMATORS
            ESTIMATORS.get(name)
        elif kind == "shaper":
            from sparring.advantages.shaping import SHAPERS
            SHAPERS.get(name)
        elif kind == "objective":
            from sparring.objectives import OBJECTIVES
            from sparring.objectives import _load_families as load_obj
            load_obj()
            OBJECTIVES.get(name)
        elif kind == "aggregation":
            from sparring.aggregation import AGGREGATIONS
            AGGREGATIONS.get(name)
        else:
            from sparring.envs import ENVS
            from sparring.envs import _load as load_envs
            try:
                load_envs()
            except ModuleNotFoundError as e:  # an env sub-package not written yet
                if not (e.name or "").startswith("sparring.envs"):
                    raise
            ENVS.get(name)
    except UnknownNameError as e:
        raise ConfigError(f"{key}: {e}") from None


def _options_check(kind: str, name: str, options: dict[str, Any], key: str) -> None:
    """Options must be keyword options of the registered function (clear error otherwise)."""
    if kind == "estimator":
        from sparring.advantages import ESTIMATORS as reg
        internal: tuple[str, ...] = ("state",)
    elif kind == "shaper":
        from sparring.advantages.shaping import SHAPERS as reg
        internal = ()
    else:
        from sparring.objectives import OBJECTIVES as reg
        internal = ("ref_logp", "group", "rewards", "agent", "episode", "turn", "length")
    try:
        reg.get(name).check_options(options, kind, internal)
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None


def validate(cfg: Config) -> Config:
    """Cross-field checks, registry names and their options; returns ``cfg``."""
    _algorithm_check(cfg.algorithm, cfg.envs, "algorithm")
    for i, env in enumerate(cfg.envs):
        _registry_check("env", env.name, f"envs.{i}.name")
        game = _env_options_check(i, env)
        if cfg.rollout.pool_explore_tactical and "pool" in env.opponents:
            _lookahead_check(i, game)
    _betas_check(cfg.optim.betas, "optim.betas")
    if cfg.train.microbatch_size and cfg.train.minibatch_size \
            and cfg.train.microbatch_size > cfg.train.minibatch_size:
        raise ConfigError("train.microbatch_size: must not exceed train.minibatch_size")
    if cfg.rollout.answer_format.count("{}") != 1:
        raise ConfigError(f"rollout.answer_format: {cfg.rollout.answer_format!r} needs exactly "
                          "one {}, where the move goes (e.g. '<answer>{}</answer>')")
    if not cfg.rollout.answer_format.split("{}")[0].startswith(cfg.rollout.answer_prefix):
        raise ConfigError(f"rollout.answer_prefix: {cfg.rollout.answer_prefix!r} must start "
                          f"rollout.answer_format ({cfg.rollout.answer_format!r}, the text "
                          "before the move), since every answer starts with it")
    _model_check(cfg.model)
    _run_dir_check(cfg.train.run_dir)
    _opponents_check(cfg)
    _minimax_check(cfg)
    _distributed_check(cfg.distributed)
    _policies_check(cfg)
    return cfg


def _algorithm_check(a: AlgorithmConfig, envs: list[EnvSpec], key: str) -> None:
    """Registry names and keyword options of ``a`` (``algorithm``, or a policy's own at
    ``key``), the estimator's options of every env spec, a critic where the estimator
    needs one."""
    _registry_check("estimator", a.estimator, f"{key}.estimator")
    _registry_check("objective", a.objective, f"{key}.objective")
    _options_check("estimator", a.estimator, a.estimator_options, f"{key}.estimator_options")
    _options_check("objective", a.objective, a.objective_options, f"{key}.objective_options")
    _registry_check("aggregation", a.aggregation, f"{key}.aggregation")
    for i, spec in enumerate(a.shaping):
        if set(spec) - {"name", "options"} or "name" not in spec:
            raise ConfigError(f"{key}.shaping.{i}: expected {{name: ..., options: {{...}}}}, "
                              f"got {spec!r}")
        _registry_check("shaper", spec["name"], f"{key}.shaping.{i}.name")
        _options_check("shaper", spec["name"], spec.get("options") or {},
                       f"{key}.shaping.{i}.options")
    for i, env in enumerate(envs):
        _options_check("estimator", a.estimator, env.estimator_options,
                       f"envs.{i}.estimator_options")
    if a.sampler_correction != "off" and not a.recompute_old_logp:
        raise ConfigError(f"{key}.sampler_correction: {a.sampler_correction!r} compares the "
                          "sampler's log-probs with the learner's recomputation; set "
                          f"{key}.recompute_old_logp=true too")
    from sparring.advantages import ESTIMATORS
    critic_needs = {"values", "utterance_critic"} & set(ESTIMATORS.get(a.estimator).needs)
    if critic_needs and a.value == "off":
        raise ConfigError(f"{key}.value: estimator {a.estimator!r} needs "
                          f"{' and '.join(sorted(critic_needs))} from a critic the learner "
                          "trains; set it to auto or on")


def _betas_check(betas: list[float], key: str) -> None:
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ConfigError(f"{key}: expected two numbers in [0, 1), got {betas}")


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with the keys of ``over`` on top; mappings in both are merged the same way."""
    out = dict(base)
    for k, v in over.items():
        out[k] = (_merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict)
                  else v)
    return out


def policy_config(cfg: Config, name: str) -> Config:
    """``cfg`` as policy ``name`` of ``policies`` sees it: ``model``, ``optim``, ``lora``,
    ``algorithm`` and then ``algorithm.kl`` with the policy's keys over the top-level ones
    (mappings such as ``model.options`` merged key by key). A copy; errors name
    ``policies.NAME.<section>``."""
    import copy

    if name not in cfg.policies:
        raise ConfigError(f"policies: no policy {name!r}{did_you_mean(name, list(cfg.policies))}"
                          f" (defined: {', '.join(cfg.policies) or 'none'})")
    spec, out = cfg.policies[name], copy.deepcopy(cfg)
    key = f"policies.{name}"
    out.model = build(ModelConfig, _merged(asdict(cfg.model), spec.model), f"{key}.model")
    out.optim = build(OptimConfig, _merged(asdict(cfg.optim), spec.optim), f"{key}.optim")
    out.lora = build(LoraConfig, _merged(asdict(cfg.lora), spec.lora), f"{key}.lora")
    out.algorithm = build(AlgorithmConfig, _merged(asdict(cfg.algorithm), spec.algorithm),
                          f"{key}.algorithm")
    out.algorithm.kl = build(KLConfig, _merged(asdict(out.algorithm.kl), spec.kl), f"{key}.kl")
    return out


_POLICY_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def _policies_check(cfg: Config) -> None:
    """``policies`` and ``envs[].seats``: names that can name files and metrics, overrides
    that build, every env mapping each of its seats to a defined policy, every policy
    playing some seat; what several policies do not support yet (rollout workers, the vLLM
    backend, the opponent pool with ``lora.shared_base``) is refused; ``lora.shared_base``
    needs LoRA and one model."""
    if cfg.lora.shared_base and not cfg.lora.enabled:
        raise ConfigError("lora.shared_base: policies share a base model as LoRA adapters; "
                          "set lora.enabled=true too")
    if not cfg.policies:
        for i, env in enumerate(cfg.envs):
            if env.seats:
                raise ConfigError(f"envs.{i}.seats: names policies, but the config defines "
                                  "none; add them (e.g. policies: {a: {}, b: {}}) or drop "
                                  f"envs.{i}.seats (one policy then plays every seat)")
        return
    names = list(cfg.policies)
    from sparring.envs import make

    for n in names:
        if not _POLICY_NAME.match(n):
            raise ConfigError(f"policies.{n}: a policy name is letters, digits, _ and -, "
                              "starting with a letter (it names checkpoint files and metrics)")
        pc = policy_config(cfg, n)
        _model_check(pc.model, f"policies.{n}.model")
        if cfg.policies[n].algorithm:
            _algorithm_check(pc.algorithm, cfg.envs, f"policies.{n}.algorithm")
        _betas_check(pc.optim.betas, f"policies.{n}.optim.betas")
        if cfg.lora.shared_base and cfg.policies[n].model:
            raise ConfigError(f"policies.{n}.model: with lora.shared_base every policy is an "
                              "adapter on the one base model (`model`); drop it or set "
                              "lora.shared_base=false")
        if cfg.lora.shared_base and not pc.lora.enabled:
            raise ConfigError(f"policies.{n}.lora.enabled: with lora.shared_base every policy "
                              "is a LoRA adapter; it cannot be false")
    from sparring.advantages import ESTIMATORS
    layouts = {n: ESTIMATORS.get(policy_config(cfg, n).algorithm.estimator).layout
               for n in names}
    if len(set(layouts.values()) - {"any"}) > 1:
        shown = ", ".join(f"{n}: {v}" for n, v in layouts.items())
        raise ConfigError(f"policies: the estimators need different row layouts ({shown}); "
                          "one batch is collated for all policies, so pick estimators that "
                          "share one")
    used: set[str] = set()
    for i, env in enumerate(cfg.envs):
        n_seats = make(env.name, **env.options).num_seats
        if not env.seats:
            raise ConfigError(f"envs.{i}.seats: with `policies` every env names the policy of "
                              f"each of its {n_seats} seats (defined: {', '.join(names)})")
        if len(env.seats) != n_seats:
            raise ConfigError(f"envs.{i}.seats: {env.name} has {n_seats} seats, got "
                              f"{len(env.seats)} names {env.seats}")
        for j, seat in enumerate(env.seats):
            if seat not in cfg.policies:
                raise ConfigError(f"envs.{i}.seats.{j}: unknown policy {seat!r}"
                                  f"{did_you_mean(seat, names)} (defined in policies: "
                                  f"{', '.join(names)})")
        if "pool" in env.opponents and cfg.lora.shared_base:
            raise ConfigError(f"envs.{i}.opponents: 'pool' (past snapshots of each policy) "
                              "does not support lora.shared_base yet (a snapshot would be "
                              "the shared model's adapters); use self or bots, or set "
                              "lora.shared_base=false")
        used.update(env.seats)
    idle = [n for n in names if n not in used]
    if idle:
        raise ConfigError(f"policies.{idle[0]}: no env seat plays it (envs[].seats), so it "
                          "would never train")
    if cfg.distributed.rollout_workers:
        raise ConfigError("distributed.rollout_workers: rollout workers do not support "
                          "several policies yet; set it to 0 or drop `policies`")
    if cfg.model.backend != "hf":
        raise ConfigError(f"model.backend: {cfg.model.backend} does not support several "
                          "policies yet; use hf or drop `policies`")


def _distributed_check(d: DistributedConfig) -> None:
    """Any ``distributed.*`` away from its default needs Ray (the error gives the install
    command); async needs workers and a staleness bound of at least one update."""
    default = DistributedConfig()
    changed = [f.name for f in fields(d) if getattr(d, f.name) != getattr(default, f.name)]
    if not changed:
        return
    import importlib.util
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(f"distributed.{changed[0]}: rollout workers run on Ray, which is not "
                          "installed: pip install 'sparring[ray]' (from a checkout: "
                          "SPARRING_EXTRAS=dev,ray bash scripts/setup.sh)")
    if d.mode == "async" and d.rollout_workers == 0:
        raise ConfigError("distributed.mode: async needs rollout workers "
                          "(distributed.rollout_workers >= 1)")
    if d.mode == "async" and d.max_staleness == 0:
        raise ConfigError("distributed.max_staleness: async needs >= 1 (0 updates of "
                          "staleness is distributed.mode=sync)")


def _model_check(m: ModelConfig, key: str = "model") -> None:
    """``model.device`` parses as a torch device; the tiny model's options are its fields
    (errors name ``key``, the section's path)."""
    if m.device != "auto":
        import torch
        try:
            torch.device(m.device)
        except (RuntimeError, ValueError):
            raise ConfigError(f"{key}.device: {m.device!r} is not a device (allowed: cpu, "
                              "cuda, cuda:N, mps, auto)") from None
    if m.name.startswith(("/", "./", "../", "~")) or Path(m.name).expanduser().exists():
        folder = Path(m.name).expanduser()
        if not (folder / "config.json").is_file():
            why = "has no config.json" if folder.is_dir() else "does not exist"
            raise ConfigError(f"{key}.name: {m.name!r} {why}; give a Hugging Face model "
                              "folder, a hub id, 'tiny' or 'smollm2'")
    if m.name != "tiny":
        return
    import typing

    from sparring.policy.tiny import TinyConfig
    hints = typing.get_type_hints(TinyConfig)
    for k, v in m.options.items():
        if k not in hints:
            raise ConfigError(f"{key}.options: the tiny model has no option {k!r}"
                              f"{did_you_mean(str(k), list(hints))} (allowed: "
                              f"{', '.join(hints)})")
        want = hints[k]
        if isinstance(v, bool) != (want is bool) or not isinstance(v, want):
            raise ConfigError(f"{key}.options.{k}: expected {want.__name__}, got {v!r}")
        if want is int and not v >= (0 if k == "seed" else 1):
            raise ConfigError(f"{key}.options.{k}: {v!r} is out of range (must be >= "
                              f"{0 if k == 'seed' else 1})")
    try:
        TinyConfig(**m.options)
    except ValueError as e:
        raise ConfigError(f"{key}.options: {e}") from None


def _run_dir_check(run_dir: str) -> None:
    try:
        filled = run_dir.format(name="run", time="20000101-000000")
    except (KeyError, IndexError, ValueError, AttributeError) as e:
        why = f"unknown field {{{e.args[0]}}}" if isinstance(e, KeyError) else str(e)
        raise ConfigError(f"train.run_dir: {run_dir!r} is not a valid pattern ({why}); "
                          "the fields are {name} and {time}, write {{ and }} for braces") \
            from None
    if not filled.strip() or "\0" in filled:
        raise ConfigError(f"train.run_dir: {run_dir!r} is not a folder name")


def _env_options_check(i: int, env: EnvSpec) -> Any:
    """The options of ``envs.i`` are keywords its constructor takes, with values it accepts
    (the env is built once here, so a bad value fails before any run folder exists), and
    its other fields fit the game; returns the game built."""
    import inspect

    from sparring.envs import env_entry
    entry = env_entry(env.name)
    key = f"envs.{i}.options"
    params = dict(inspect.signature(entry.fn).parameters)
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):  # a factory passing **options
        cls = inspect.signature(entry.fn).return_annotation
        if isinstance(cls, str):
            cls = entry.fn.__globals__.get(cls, inspect.Signature.empty)
        params = dict(inspect.signature(cls).parameters) if inspect.isclass(cls) else params
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        names = [n for n, p in params.items() if p.kind is not p.VAR_POSITIONAL
                 and n != "self"]
        for k in env.options:
            if k not in names:
                raise ConfigError(f"{key}: {entry.name} has no option {k!r}"
                                  f"{did_you_mean(str(k), names)} (allowed: "
                                  f"{', '.join(names) or 'none'})")
    from sparring.registry import option_type_error
    wrong = option_type_error(entry.fn, dict(env.options))
    if wrong:
        raise ConfigError(f"{key}: {entry.name} {wrong}")
    try:
        made = entry.fn(**env.options)
    except ImportError as e:
        raise ConfigError(f"envs.{i}.name: {entry.name} needs an optional package ({e})") \
            from None
    except (TypeError, ValueError, KeyError) as e:
        raise ConfigError(f"{key}: {entry.name} rejects {env.options!r}: {e}") from None
    bad = [s for s in env.learner_seats if not 0 <= s < made.num_seats]
    if bad:
        raise ConfigError(f"envs.{i}.learner_seats: {bad} out of range; {entry.name} has "
                          f"seats 0..{made.num_seats - 1}")
    from sparring.envs.wrappers import RandomOpening, SymmetricViews
    game = made
    if env.symmetric_views and env.options.get("canonical"):
        raise ConfigError(f"envs.{i}.symmetric_views: the game's option canonical already "
                          "shows every position in one orientation, and random views would "
                          f"undo it; set envs.{i}.symmetric_views=false or drop canonical")
    if env.symmetric_views:
        try:
            made = SymmetricViews(made)
        except ValueError as e:
            raise ConfigError(f"envs.{i}.symmetric_views: {e}; set envs.{i}.symmetric_views="
                              "false for this game") from None
    if env.opening_moves:
        try:
            RandomOpening(made, env.opening_moves)
        except ValueError as e:
            raise ConfigError(f"envs.{i}.opening_moves: {e}") from None
    return game


def _lookahead_check(i: int, game: Any) -> None:
    """``rollout.pool_explore_tactical``: the pool's game ``envs.i`` can be searched by
    copies with nothing hidden (`sparring.envs.lookahead.check_lookahead`)."""
    from sparring.envs.lookahead import check_lookahead
    try:
        check_lookahead(game)
    except ValueError as e:
        raise ConfigError(f"rollout.pool_explore_tactical: {e} (envs.{i} plays the pool)") \
            from None


def _opponents_check(cfg: Config) -> None:
    """Bot names of ``envs.*.opponents``, ``rollout.pool_bots``, ``eval.opponents``; a
    'pool' opponent needs a pool that is not empty at step 0."""
    from sparring.envs.bots import check_opponents
    special = ("self", "pool")

    def names(key: str, given: list[str], allowed: tuple[str, ...] = ()) -> None:
        try:
            check_opponents(key, given, allowed)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    names("rollout.pool_bots", cfg.rollout.pool_bots)
    names("eval.opponents", cfg.eval.opponents)
    for i, env in enumerate(cfg.envs):
        names(f"envs.{i}.opponents", env.opponents, special)
        if "pool" in env.opponents and not cfg.rollout.pool_bots:
            raise ConfigError(
                f"envs.{i}.opponents: 'pool' samples from rollout.pool_bots and snapshots "
                "of the policy, but rollout.pool_bots is empty, so the pool has nothing to "
                "sample before its first snapshot"
                + (" (and rollout.pool_every is 0: it never takes one)"
                   if not cfg.rollout.pool_every else "")
                + "; add a bot to rollout.pool_bots")


def _minimax_check(cfg: Config) -> None:
    """Each game played against ``minimax`` (an opponent, a pool bot or an evaluation
    opponent) can be solved exactly: a game minimax cannot play (three seats, no
    ``clone``) or whose tree is too large (Connect Four) is refused here, not at the
    first evaluation hours later."""
    from sparring.envs import make
    from sparring.envs.bots.minimax import forget, minimax_value
    for i, spec in enumerate(cfg.envs):
        pool = cfg.rollout.pool_bots if "pool" in spec.opponents else []
        keys = [k for k, names in (("eval.opponents", cfg.eval.opponents),
                                   (f"envs.{i}.opponents", spec.opponents),
                                   ("rollout.pool_bots", pool)) if "minimax" in names]
        env = make(spec.name, **spec.options) if keys else None
        if env is None or (keys == ["eval.opponents"] and env.num_seats < 2):
            continue  # (the evaluation plays bots in games only)
        try:
            minimax_value(env)
        except (TypeError, ValueError) as e:
            forget(env)
            raise ConfigError(f"{keys[0]}: minimax cannot play envs.{i} ({spec.name}): {e}") \
                from None


def config_warnings(cfg: Config) -> list[str]:
    """What a valid config does that its author may not expect (printed by ``sparring
    train``): episode counts rounded to whole groups, opponents left without episodes,
    a group-relative estimator with one episode per group."""
    from sparring.advantages import ESTIMATORS
    from sparring.rollout.plan import episode_counts

    out = []
    counts = episode_counts(cfg)
    if cfg.envs and sum(counts) != cfg.rollout.episodes_per_step:
        sizes = ", ".join(f"envs.{i}.group_size={s.group_size}" for i, s in enumerate(cfg.envs))
        out.append(f"rollout.episodes_per_step={cfg.rollout.episodes_per_step} is rounded to "
                   f"whole groups ({sizes}): each step plays {sum(counts)} episodes "
                   f"({' + '.join(map(str, counts))})")
    needs_group = "group" in ESTIMATORS.get(cfg.algorithm.estimator).needs
    for i, (spec, n) in enumerate(zip(cfg.envs, counts)):
        kinds = spec.opponents or ["self"]
        groups = n // spec.group_size
        if groups < len(kinds):
            out.append(f"envs.{i}.opponents: {groups} group(s) a step for {len(kinds)} "
                       f"opponent kinds: {', '.join(dict.fromkeys(kinds[groups:]))} get no "
                       "episodes (raise rollout.episodes_per_step)")
        if needs_group and spec.group_size == 1:
            out.append(f"envs.{i}.group_size=1: estimator {cfg.algorithm.estimator!r} compares "
                       "the episodes of a group, and one episode per group has nothing to "
                       "compare (zero advantages, but for the seats of a self-play game)")
    return out


_RESUME_FIXED = ("model", "lora", "algorithm.value", "algorithm.critic",
                 "algorithm.value_hidden", "algorithm.kl.reference", "rollout.pool_bots")
_RESUME_FREE = ("model.device",)


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} of the mappings in ``d`` (an empty mapping has no keys)."""
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: d}


def check_resume_overrides(saved: Config, resumed: Config) -> None:
    """Raise `ConfigError` naming the first key whose change a checkpoint cannot follow:
    the model's shape (``model.*`` but ``model.device``, ``lora.*``), the critic and the
    KL reference (their weights are in the checkpoint), the pool's bots (its saved state
    names them), the set of ``policies`` and their own ``model``, ``lora`` and
    ``kl.reference``. ``trust_remote_code`` goes on the command line (``--trust-remote-code``)."""
    if list(saved.policies) != list(resumed.policies):
        raise ConfigError(f"policies: cannot change on --resume (the checkpoint holds "
                          f"{list(saved.policies) or 'one policy'}); start a new run for that")
    old, new = _flat(to_dict(saved)), _flat(to_dict(resumed))
    for key in sorted(set(old) | set(new)):
        # a policy's own sections follow the rules of the top-level ones
        section = re.sub(r"^policies\.[^.]+\.(kl\.|algorithm\.)?",
                         lambda m: {"kl.": "algorithm.kl.", "algorithm.": "algorithm."}.get(
                             m.group(1) or "", ""), key)
        if old.get(key, None) == new.get(key, None) or section.startswith(_RESUME_FREE):
            continue
        if any(section == f or section.startswith(f + ".") for f in _RESUME_FIXED):
            hint = (" (pass --trust-remote-code instead)" if key == "model.trust_remote_code"
                    else "; start a new run for that")
            raise ConfigError(f"{key}: cannot change on --resume (the checkpoint was made "
                              f"with {old.get(key)!r}){hint}")


def to_dict(cfg: Config) -> dict[str, Any]:
    return asdict(cfg)


def from_dict(data: dict[str, Any] | None, overrides: list[str] | tuple[str, ...] = (),
              check: bool = True) -> Config:
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"a config file must hold a mapping, got {type(data).__name__}")
    cfg = build(Config, data or {})
    for item in overrides:
        apply_override(cfg, item)
    from sparring.plugins import PluginError, import_plugins
    try:
        import_plugins(cfg.plugins)  # before the names they register are checked
    except PluginError as e:
        raise ConfigError(f"plugins: {e}") from None
    return validate(cfg) if check else cfg


def recipe_dirs() -> list[Path]:
    """Where recipe names are looked up: ./configs, then the checkout's configs/."""
    here = Path("configs")
    repo = Path(__file__).resolve().parents[3] / "configs"
    return [here] + ([repo] if repo.is_dir() and repo.resolve() != here.resolve() else [])


def find_recipe(name: str | Path | None) -> Path | None:
    """The YAML file of ``name``: a path, or a recipe name in `recipe_dirs` (``"default"``
    and None: configs/default.yaml, or None, the built-in defaults, when there is none)."""
    if name is None:
        name = "default"
    elif Path(name).is_file():
        return Path(name)
    for d in recipe_dirs():
        for cand in (d / f"{name}.yaml", d / name):
            if cand.is_file():
                return cand
    if name == "default":
        return None
    raise FileNotFoundError(f"no config {str(name)!r} (not a file, not configs/{name}.yaml)")


MAX_CONFIG_VALUES = 100_000  # far above any real config; a YAML alias bomb is far above it


def read_yaml(path: str | Path) -> Any:
    """The YAML document in ``path``. A `ConfigError` naming the file for what cannot be a
    config: bytes that are not UTF-8, a syntax error (with its line), nesting too deep for
    the parser, or more than `MAX_CONFIG_VALUES` values once aliases are expanded."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a config") from None
    _check_size(data, path)
    return data


def _check_size(data: Any, path: str | Path) -> None:
    """ConfigError when ``data`` holds more than `MAX_CONFIG_VALUES` values, counting each
    use of a YAML alias (a shared object) again, as everything after loading would."""
    stack, seen = [data], 0
    while stack:
        x = stack.pop()
        seen += 1
        if seen > MAX_CONFIG_VALUES:
            raise ConfigError(f"{path}: more than {MAX_CONFIG_VALUES:,} values once its YAML "
                              "aliases are expanded; not a config")
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                check: bool = True) -> Config:
    """Defaults <- YAML file ``path`` <- ``overrides``; validated unless ``check=False``."""
    data = None if path is None else read_yaml(path)
    return from_dict(data, overrides, check)


def save_config(cfg: Config, path: str | Path) -> None:
    """Write ``cfg`` as YAML atomically (a kill leaves the old file or the new one)."""
    from sparring.train.atomic import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


def commented_yaml(cls: type = Config, indent: int = 0) -> str:
    """The defaults of ``cls`` as YAML with each field's help as a comment."""
    out, pad = [], " " * indent
    obj = cls()
    for f in fields(cls):
        value = getattr(obj, f.name)
        out.append(f"{pad}# {f.metadata.get('help', '')}")
        if is_dataclass(value):
            out.append(f"{pad}{f.name}:")
            out.append(commented_yaml(type(value), indent + 2))
        else:
            dumped = yaml.safe_dump({f.name: value}, default_flow_style=True, width=1000).strip()
            out.append(pad + dumped[1:-1] if dumped.startswith("{") else pad + dumped)
    return "\n".join(out)


__all__ = ["AlgorithmConfig", "ArcherConfig", "CheckpointConfig", "Config", "ConfigError",
           "DistributedConfig", "EnvSpec",
           "EvalConfig", "KLConfig", "LoggingConfig", "LoraConfig", "ModelConfig",
           "OptimConfig", "PolicySpec", "RolloutConfig", "TrainConfig", "apply_override",
           "check_resume_overrides", "commented_yaml", "config_warnings", "find_recipe",
           "from_dict", "load_config", "policy_config",
           "read_yaml", "save_config", "to_dict", "validate"]
