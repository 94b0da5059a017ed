"""Checks of a `Config` beyond its types and bounds (`validate`, which raises
`ConfigError` naming the key): registry names and their options, environments and their
options, opponents, several policies, Ray workers, the model; and `config_warnings`, what
a valid config does that its author may not expect."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparring.config.components import EXPLORERS, component_error
from sparring.config.overlay import policy_config
from sparring.config.overrides import ConfigError, did_you_mean

if TYPE_CHECKING:
    from sparring.config.schema import (
        AlgorithmConfig,
        Config,
        CriticConfig,
        DistributedConfig,
        EnvSpec,
        ModelConfig,
        OptimConfig,
    )


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
    _exploration_check(cfg)
    _algorithm_check(cfg.algorithm, cfg.envs, "algorithm", _learner_rate(cfg),
                     cfg.rollout.invalid_action, cfg.distributed.mode == "async")
    _critic_check(cfg.critic, cfg.algorithm.estimator, "critic")
    for i, env in enumerate(cfg.envs):
        _registry_check("env", env.name, f"envs.{i}.name")
        game = _env_options_check(i, env)
        for who, spec in cfg.exploration.items():
            if spec.tactical and (who == "learner" or "pool" in env.opponents):
                _lookahead_check(i, game, who)
    _betas_check(cfg.optim.betas, "optim.betas")
    _head_check(cfg, "model.head")
    if cfg.train.microbatch_size and cfg.train.microbatch_tokens:
        raise ConfigError("train.microbatch_size and train.microbatch_tokens: set one of them "
                          "(rows per micro-batch, or padded tokens per micro-batch)")
    if cfg.train.microbatch_tokens and cfg.distributed.sharding == "full":
        raise ConfigError("train.microbatch_tokens: not with distributed.sharding: full, "
                          "where every rank runs as many micro-batches of equal rows; use "
                          "train.microbatch_size")
    if cfg.train.microbatch_size and cfg.train.minibatch_size \
            and cfg.train.microbatch_size > cfg.train.minibatch_size:
        raise ConfigError("train.microbatch_size: must not exceed train.minibatch_size")
    if _learner_rate(cfg) and cfg.rollout.layout == "trajectory":
        raise ConfigError("exploration.learner.rate: explored moves are marked per turn, and "
                          "the trajectory layout joins a seat's turns into one row; use "
                          "rollout.layout=turn")
    if cfg.rollout.answer_format.count("{}") != 1:
        raise ConfigError(f"rollout.answer_format: {cfg.rollout.answer_format!r} needs exactly "
                          "one {}, where the move goes (e.g. '<answer>{}</answer>')")
    if not cfg.rollout.answer_format.split("{}")[0].startswith(cfg.rollout.answer_prefix):
        raise ConfigError(f"rollout.answer_prefix: {cfg.rollout.answer_prefix!r} must start "
                          f"rollout.answer_format ({cfg.rollout.answer_format!r}, the text "
                          "before the move), since every answer starts with it")
    if cfg.eval.free_text and cfg.rollout.invalid_action != "constrained":
        raise ConfigError("eval.free_text: evaluates a run held to constrained decoding "
                          "without the constraint; this run's rollout.invalid_action is "
                          f"{cfg.rollout.invalid_action!r}, so its evaluation is free already")
    _model_check(cfg.model)
    _run_dir_check(cfg.train.run_dir)
    _run_name_check(cfg.train.name)
    _opponents_check(cfg)
    _minimax_check(cfg)
    _distributed_check(cfg.distributed)
    _policies_check(cfg)
    return cfg


def _learner_rate(cfg: Config) -> float:
    """The learner's exploration rate (``exploration.learner.rate``; 0 without an entry)."""
    spec = cfg.exploration.get("learner")
    return spec.rate if spec is not None else 0.0


def _exploration_check(cfg: Config) -> None:
    """``exploration`` names who explores among `EXPLORERS`."""
    for who in cfg.exploration:
        if who not in EXPLORERS:
            raise ConfigError(f"exploration.{who}: no player of that name explores"
                              f"{did_you_mean(who, list(EXPLORERS))} (allowed: "
                              f"{', '.join(EXPLORERS)})")


def _algorithm_check(a: AlgorithmConfig, envs: list[EnvSpec], key: str,
                     explore: float = 0.0, invalid_action: str = "constrained",
                     stale: bool = False) -> None:
    """Registry names and keyword options of ``a`` (``algorithm``, or a policy's own at
    ``key``), the estimator's options of every env spec, recomputed old log-probs where
    the learner explores (``explore``, its rate) and where the sampler's importance
    correction is asked for (unless ``stale``: async rollout workers, whose correction
    needs none), constrained decoding for the uniform-KL bonus."""
    if a.entropy_bonus != "entropy":
        b = a.entropy_bonus
        if invalid_action != "constrained":
            raise ConfigError(f"{key}.entropy_bonus: {b!r} weighs the tokens constrained "
                              "decoding allows, which only constrained decoding knows; "
                              "set rollout.invalid_action=constrained (or use 'entropy')")
        if a.entropy_target is not None:
            raise ConfigError(f"{key}.entropy_target holds the token entropy, which "
                              f"{key}.entropy_bonus={b!r} does not weigh; drop one")
    if explore > 0 and not a.recompute_old_logp:
        raise ConfigError(f"exploration.learner.rate: {explore} plays moves the sampler did "
                          "not sample, so they have no sampler log-probs; set "
                          f"{key}.recompute_old_logp=true (the learner scores them)")
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
    if a.entropy_target is not None:
        if a.entropy_coef <= 0:
            raise ConfigError(f"{key}.entropy_target: {a.entropy_target} adapts the entropy "
                              f"bonus from its start {key}.entropy_coef, which is 0; set "
                              f"{key}.entropy_coef > 0 (e.g. 0.01)")
        if a.entropy_schedule != "constant" or a.entropy_warmup_steps:
            raise ConfigError(f"{key}.entropy_target sets the bonus each update, so "
                              f"{key}.entropy_schedule={a.entropy_schedule!r} and "
                              f"{key}.entropy_warmup_steps={a.entropy_warmup_steps} would be "
                              "ignored; leave them 'constant' and 0")
    level = a.importance_correction.level
    if level not in ("off", "auto") and not a.recompute_old_logp and not stale:
        raise ConfigError(f"{key}.importance_correction.level: {level!r} compares the "
                          "sampler's log-probs with the learner's recomputation; set "
                          f"{key}.recompute_old_logp=true too (async rollout workers "
                          "correct their stale samples without it)")


def _critic_check(c: CriticConfig, estimator: str, key: str) -> None:
    """A critic where ``estimator`` needs one (``c``: ``critic``, or a policy's own at
    ``key``)."""
    from sparring.advantages import ESTIMATORS
    critic_needs = {"values", "utterance_critic"} & set(ESTIMATORS.get(estimator).needs)
    if critic_needs and c.enabled == "off":
        raise ConfigError(f"{key}.enabled: estimator {estimator!r} needs "
                          f"{' and '.join(sorted(critic_needs))} from a critic the learner "
                          "trains; set it to auto or on")


def _head_check(cfg: Config, key: str) -> None:
    """``model.head`` (of ``cfg``, or of a policy's config at ``key``) is a registered head
    with its options; one that trains the output layer apart from the body needs a trained
    output layer, which LoRA has not."""
    from sparring.policy.heads import build_head
    try:
        head = build_head(cfg.model.head)
    except (KeyError, ValueError) as e:
        raise component_error(key, e) from None
    if cfg.model.decode == "compiled" and getattr(head, "cache", 0):
        raise ConfigError(f"{key}: {head.name} with a cache decodes through its cached "
                          "features, which model.decode='compiled' cannot; set "
                          "model.decode=dynamic or the head's cache to 0")
    if head.body_lr_scale != 1 and cfg.lora.enabled:
        raise ConfigError(f"{key}: {head.name} (body_lr_scale {head.body_lr_scale}) trains "
                          "the output layer apart from the body, and with lora.enabled only "
                          "adapters train (no output layer); use lm_head with body_lr_scale "
                          "1 with LoRA")
    layers = getattr(head, "layers", None)  # top_layers: adapters only where weights train
    if layers is not None and cfg.lora.enabled and not 1 <= cfg.lora.last_layers <= layers:
        raise ConfigError(f"{key}: top_layers trains the top {layers} layer(s) only; with "
                          f"LoRA set lora.last_layers between 1 and {layers} (it is "
                          f"{cfg.lora.last_layers}: 0 puts adapters in every layer)")


def _betas_check(betas: list[float], key: str) -> None:
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ConfigError(f"{key}: expected two numbers in [0, 1), got {betas}")


def _ignored_warmup(o: OptimConfig, key: str) -> list[str]:
    """A warm-up the schedule does not have (``constant`` ignores ``warmup_steps``)."""
    if o.schedule == "constant" and o.warmup_steps:
        return [f"{key}.warmup_steps={o.warmup_steps} is ignored: {key}.schedule='constant' "
                "has no warm-up ('warmup' is a warm-up, then constant)"]
    return []


_POLICY_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def _policies_check(cfg: Config) -> None:
    """``policies`` and ``envs[].seats``: names that can name files and metrics, overrides
    that build, every env mapping each of its seats to a defined policy, every policy
    playing some seat; ``lora.shared_base`` needs LoRA and one model, ``lora.last_layers``
    LoRA."""
    if cfg.lora.shared_base and not cfg.lora.enabled:
        raise ConfigError("lora.shared_base: policies share a base model as LoRA adapters; "
                          "set lora.enabled=true too")
    if cfg.lora.last_layers and not cfg.lora.enabled:
        raise ConfigError("lora.last_layers: places LoRA adapters, and lora.enabled is false; "
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
            _algorithm_check(pc.algorithm, cfg.envs, f"policies.{n}.algorithm",
                             _learner_rate(cfg), cfg.rollout.invalid_action,
                             cfg.distributed.mode == "async")
        if cfg.policies[n].algorithm or cfg.policies[n].critic:
            _critic_check(pc.critic, pc.algorithm.estimator, f"policies.{n}.critic")
        _betas_check(pc.optim.betas, f"policies.{n}.optim.betas")
        _head_check(pc, f"policies.{n}.model.head")
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
        used.update(env.seats)
    idle = [n for n in names if n not in used]
    if idle:
        raise ConfigError(f"policies.{idle[0]}: no env seat plays it (envs[].seats), so it "
                          "would never train")


def _distributed_check(d: DistributedConfig) -> None:
    """Any ``distributed.*`` away from its default needs Ray (the error gives the install
    command), except ``sharding`` (torchrun's ranks shard too); async needs
    workers and a staleness bound of at least one update."""
    default = type(d)()
    changed = [f.name for f in fields(d) if getattr(d, f.name) != getattr(default, f.name)
               and f.name != "sharding"]
    if not changed:
        return
    import importlib.util
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(f"distributed.{changed[0]}: rollout workers and learner rank actors "
                          "run on Ray, which is not installed: pip install 'sparring[ray]' "
                          "(from a checkout: SPARRING_EXTRAS=dev,ray bash scripts/setup.sh)")
    if d.mode == "async" and d.rollout_workers == 0:
        raise ConfigError("distributed.mode: async needs rollout workers "
                          "(distributed.rollout_workers >= 1)")
    if d.mode == "async" and d.max_staleness == 0:
        raise ConfigError("distributed.max_staleness: async needs >= 1 (0 updates of "
                          "staleness is distributed.mode=sync)")


BUILT_IN_MODELS = ("tiny", "smollm2")  # these names win over folders of the same name


def _model_check(m: ModelConfig, key: str = "model") -> None:
    """``model.device`` parses as a torch device; a path names a model folder (a built-in
    name is the built-in model, whatever folders the working directory holds: ``./tiny``
    names such a folder); the tiny model's options are its fields (errors name ``key``, the
    section's path)."""
    if m.device != "auto":
        import torch
        try:
            torch.device(m.device)
        except (RuntimeError, ValueError):
            raise ConfigError(f"{key}.device: {m.device!r} is not a device (allowed: cpu, "
                              "cuda, cuda:N, mps, auto)") from None
    if m.name not in BUILT_IN_MODELS and (m.name.startswith(("/", "./", "../", "~"))
                                          or Path(m.name).expanduser().exists()):
        folder = Path(m.name).expanduser()
        if not (folder / "config.json").is_file():
            why = "has no config.json" if folder.is_dir() else "does not exist"
            raise ConfigError(f"{key}.name: {m.name!r} {why}; give a Hugging Face model "
                              "folder, a hub id, 'tiny' or 'smollm2'")
    if m.name != "tiny":
        return
    import typing

    from sparring.policy.tiny import TINY_LIMITS, TinyConfig
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
        if k in TINY_LIMITS and v > TINY_LIMITS[k]:
            raise ConfigError(f"{key}.options.{k}: {v!r} is out of range (must be <= "
                              f"{TINY_LIMITS[k]} for the tiny model; a larger model is a "
                              "Hugging Face one)")
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


def _run_name_check(name: str) -> None:
    """``train.name`` fills ``{name}`` in ``train.run_dir``: a plain name, so the run folder
    stays where ``run_dir`` puts it (no ``/``, ``..`` or a hidden name)."""
    if not name or "/" in name or "\\" in name or "\0" in name or name.startswith(".") \
            or name != name.strip():
        raise ConfigError(f"train.name: {name!r} is not a plain name (it fills {{name}} in "
                          "train.run_dir: no '/' or '\\', no leading '.', not empty); put "
                          "folders in train.run_dir")


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
    from sparring.envs.starts import check_starts, parse_starts
    try:
        check_starts(parse_starts(env.starts), made, dict(env.options))
    except ValueError as e:
        raise ConfigError(f"envs.{i}.starts.{e}") from None
    return made


def _lookahead_check(i: int, game: Any, who: str) -> None:
    """``exploration.<who>.tactical``: the game ``envs.i`` that ``who`` plays can be searched
    by copies with nothing hidden (`sparring.envs.lookahead.check_lookahead`)."""
    from sparring.envs.lookahead import check_lookahead
    try:
        check_lookahead(game)
    except ValueError as e:
        where = "plays the pool" if who == "league" else "is a training game"
        raise ConfigError(f"exploration.{who}.tactical: {e} (envs.{i} {where})") from None


def _opponents_check(cfg: Config) -> None:
    """Bot names of ``envs.*.opponents``, ``league.bots``, ``eval.opponents``, and that
    each bot can play honestly the games it meets (`sparring.envs.bots.bot_refusal`); a
    'pool' opponent needs a pool that is not empty at step 0."""
    from sparring.envs import make
    from sparring.envs.bots import check_opponents
    special = ("self", "pool")

    def names(key: str, given: list[str], allowed: tuple[str, ...] = (),
              game: Any = None, i: int | None = None) -> None:
        try:
            check_opponents(key, given, allowed, game)
        except ValueError as e:
            raise ConfigError(str(e) + ("" if i is None else f" (envs.{i})")) from None

    names("league.bots", cfg.league.bots)
    names("eval.opponents", cfg.eval.opponents)
    for i, env in enumerate(cfg.envs):
        names(f"envs.{i}.opponents", env.opponents, special)
        game = make(env.name, **env.options)
        names(f"envs.{i}.opponents", env.opponents, special, game)
        if "pool" in env.opponents:
            names("league.bots", cfg.league.bots, (), game, i)
        if game.num_seats >= 2:  # the evaluation plays bots in games only
            names("eval.opponents", cfg.eval.opponents, (), game, i)
        if "pool" in env.opponents and not cfg.league.bots:
            raise ConfigError(
                f"envs.{i}.opponents: 'pool' samples from league.bots and snapshots "
                "of the policy, but league.bots is empty, so the pool has nothing to "
                "sample before its first snapshot"
                + (" (and league.every is 0: it never takes one)"
                   if not cfg.league.every else "")
                + "; add a bot to league.bots")


def _minimax_check(cfg: Config) -> None:
    """Each game played against ``minimax`` (an opponent, a pool bot or an evaluation
    opponent) can be solved exactly: a game minimax cannot play (three seats, no
    ``clone``) or whose tree is too large (Connect Four) is refused here, not at the
    first evaluation hours later."""
    from sparring.envs import make
    from sparring.envs.bots.minimax import forget, minimax_value
    for i, spec in enumerate(cfg.envs):
        pool = cfg.league.bots if "pool" in spec.opponents else []
        keys = [k for k, names in (("eval.opponents", cfg.eval.opponents),
                                   (f"envs.{i}.opponents", spec.opponents),
                                   ("league.bots", pool)) if "minimax" in names]
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
    train``): a warm-up the lr schedule ignores, episode counts rounded to whole groups,
    opponents left without episodes, a group-relative estimator with one episode per
    group."""
    from sparring.advantages import ESTIMATORS
    from sparring.config.plan import episode_counts

    out = _ignored_warmup(cfg.optim, "optim")
    for n, spec in cfg.policies.items():  # a policy's own optim keys, once each
        if spec.optim:
            out += _ignored_warmup(policy_config(cfg, n).optim, f"policies.{n}.optim")
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
