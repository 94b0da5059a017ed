"""The training loop: rollouts -> TurnBatch -> advantages (+ shaping) -> update -> log.

``train(cfg, model, rollout_fn, eval_fn)`` runs ``cfg.train.steps`` steps; each step

1. ``episodes = rollout_fn(step)`` (the caller's rollouts, sampled from ``model``),
2. ``batch = learner.annotate(collate(episodes), stage.needs)``: what the advantage stage
   needs from the learner (critic values, ArCHer's utterance critic -- updated from its
   replay buffer first --, reference log-probs, entropies),
3. ``adv, keep = stage(batch)``: reward shapers, estimator, advantage shapers and keep
   filters, per environment (`sparring.advantages.stage.AdvantageStage`),
4. ``learner.update(batch, adv, keep)``,
5. metrics to ``metrics.jsonl``; evaluation every ``eval.every`` steps and at the end;
   a checkpoint every ``checkpoint.every`` steps, at the end, and on a crash
   (exception or Ctrl-C) before the error propagates.

``resume(run_dir, model, rollout_fn, ...)`` continues from the last checkpoint; with the
same seeds on CPU the metrics match an uninterrupted run. With ``lora.enabled`` the
adapters are injected into ``model`` in place, so a ``rollout_fn`` that closes over
``model`` samples from the trained policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from sparring.advantages.stage import AdvantageStage
from sparring.data import Episode, TurnBatch, collate
from sparring.segments import segment_first
from sparring.train.checkpoint import (
    RNGState,
    latest_checkpoint,
    load_checkpoint,
    load_weights,
    save_checkpoint,
    seed_everything,
    step_dirs,
)
from sparring.train.config import Config, load_config, save_config
from sparring.train.learner import Learner
from sparring.train.lora import apply_lora, is_peft, load_trainable_state, trainable_state
from sparring.train.metrics import MetricsLogger, truncate_metrics

RolloutFn = Callable[[int], Sequence[Episode]]
EvalFn = Callable[[int, Learner], Mapping[str, Any]]  # (step, learner) -> metrics
CONFIG_FILE = "config.yaml"
REFERENCE_FILE = "reference.safetensors"


def batch_layout(cfg: Config, stage: AdvantageStage) -> str:
    """The stage's estimator layout, or ``rollout.layout`` when it works on either."""
    return cfg.rollout.layout if stage.layout == "any" else stage.layout


def rollout_metrics(episodes: Sequence[Episode], batch: TurnBatch, adv: Tensor,
                    keep: Tensor) -> dict[str, float]:
    """Rewards per seat and env, advantage stats, invalid-action rate, lengths."""
    out: dict[str, float] = {"episodes": float(len(episodes))}
    if batch.n_rows:
        first = segment_first(batch.traj, batch.n_traj)
        ret, env = batch.returns[first], batch.env_id[first]
        out["reward"] = float(ret.mean())
        for k, name in enumerate(batch.env_names):
            sel = ret[env == k]
            if len(sel):
                out[f"env/{name}/return"] = float(sel.mean())
    seats: dict[int, list[float]] = {}
    for ep in episodes:
        for s, r in enumerate(ep.returns):
            seats.setdefault(s, []).append(float(r))
    for s, rs in sorted(seats.items()):
        out[f"return/seat{s}"] = sum(rs) / len(rs)
    turns = [t for ep in episodes for t in ep.turns if t.action_ids]
    out["invalid_rate"] = sum(t.invalid is not None for t in turns) / max(len(turns), 1)
    out["response_length"] = sum(len(t.action_ids) for t in turns) / max(len(turns), 1)
    out["episode_length"] = sum(len(ep.turns) for ep in episodes) / max(len(episodes), 1)
    m = batch.action_mask & keep[:, None]
    a = adv[m]
    out["adv_mean"] = float(a.mean()) if a.numel() else 0.0
    out["adv_std"] = float(a.std()) if a.numel() > 1 else 0.0
    out["kept_rows"] = float(keep.float().mean()) if keep.numel() else 0.0
    return out


def _run_dir(cfg: Config) -> Path:
    return Path(cfg.train.run_dir.format(name=cfg.train.name, time=time.strftime("%Y%m%d-%H%M%S")))


def train(cfg: Config, model: nn.Module, rollout_fn: RolloutFn, eval_fn: EvalFn | None = None,
          stateful: Mapping[str, Any] | None = None, *, run_dir: str | Path | None = None,
          pad_id: int = 0, resume: bool = False) -> Path:
    """Train ``model`` on ``rollout_fn``'s episodes; returns the run folder.

    ``stateful``: extra objects with ``state_dict``/``load_state_dict`` (running baselines,
    opponent pools, the rollout's generators) saved in every checkpoint.
    """
    run = Path(run_dir) if run_dir is not None else _run_dir(cfg)
    run.mkdir(parents=True, exist_ok=True)
    if not resume:
        if latest_checkpoint(run) is not None:
            raise FileExistsError(f"{run} already holds a run; resume it or pick another run_dir")
        save_config(cfg, run / CONFIG_FILE)
        seed_everything(cfg.train.seed)
    if cfg.lora.enabled and not is_peft(model):
        model = apply_lora(model, cfg.lora)
    stage = AdvantageStage.from_config(cfg)
    learner = Learner(model, cfg, needs=stage.needs)
    weights_name = "adapter" if is_peft(model) else "model"
    objects: dict[str, Any] = {"learner": learner, "stage": stage, "rng": RNGState()}
    objects.update({f"user.{k}": v for k, v in (stateful or {}).items()})
    ref_state = learner.reference_state()
    start = 0
    if resume:
        ckpt = latest_checkpoint(run)
        if ckpt is None:
            raise FileNotFoundError(f"{run} has no checkpoint to resume from")
        load_trainable_state(model, load_weights(ckpt, weights_name))
        if ref_state is not None:
            learner.load_reference_state(load_file(str(run / REFERENCE_FILE)))
        start = int(load_checkpoint(ckpt, objects)["step"])
        truncate_metrics(run / "metrics.jsonl", start)
    elif ref_state is not None:
        save_file({k: v.detach().to("cpu", copy=True).contiguous() for k, v in ref_state.items()},
                  str(run / REFERENCE_FILE))
    total, lg = cfg.train.steps, cfg.logging
    logger = MetricsLogger(run, total_steps=total, start_step=start, progress=lg.progress,
                           keys=lg.keys, tensorboard=lg.tensorboard, wandb=lg.wandb,
                           wandb_project=lg.wandb_project, config=None)
    layout = batch_layout(cfg, stage)
    done = start

    def checkpoint(step: int, meta: dict[str, Any] | None = None) -> None:
        save_checkpoint(run, step, weights={weights_name: trainable_state(model)},
                        stateful=objects, meta=meta, keep=cfg.checkpoint.keep)

    try:
        if start == 0 and eval_fn is not None and cfg.eval.at_start:
            logger.log(0, {f"eval/{k}": v for k, v in eval_fn(0, learner).items()})
        for i in range(start, total):
            t0 = time.perf_counter()
            episodes = list(rollout_fn(i))
            t1 = time.perf_counter()
            batch = collate(episodes, layout=layout, pad_id=pad_id).to(learner.device)
            batch, critic_metrics = learner.annotate(batch, stage.needs)
            adv, keep = stage(batch)
            metrics = rollout_metrics(episodes, batch, adv, keep)
            metrics.update(critic_metrics)
            metrics.update(learner.update(batch, adv, keep))
            t2 = time.perf_counter()
            n_tok = sum(len(t.action_ids) for ep in episodes for t in ep.turns)
            metrics.update({"time/rollout": t1 - t0, "time/update": t2 - t1,
                            "throughput/episodes_per_s": len(episodes) / max(t1 - t0, 1e-9),
                            "throughput/tokens_per_s": n_tok / max(t1 - t0, 1e-9)})
            step = i + 1
            every = cfg.eval.every
            if eval_fn is not None and (step == total or (every and step % every == 0)):
                t3 = time.perf_counter()
                metrics.update({f"eval/{k}": v for k, v in eval_fn(step, learner).items()})
                metrics["time/eval"] = time.perf_counter() - t3
            logger.log(step, metrics)
            done = step
            ck = cfg.checkpoint.every
            if step == total or (ck and step % ck == 0):
                checkpoint(step)
    except BaseException as e:
        if not any(s == done for s, _ in step_dirs(run)):
            checkpoint(done, {"crash": f"{type(e).__name__}: {e}"})
        raise
    finally:
        logger.close()
    return run


def resume(run_dir: str | Path, model: nn.Module, rollout_fn: RolloutFn,
           eval_fn: EvalFn | None = None, stateful: Mapping[str, Any] | None = None, *,
           overrides: Sequence[str] = (), pad_id: int = 0) -> Path:
    """Continue the run in ``run_dir`` from its last checkpoint (its saved config +
    ``overrides``, e.g. ``train.steps=200`` to extend it)."""
    cfg = load_config(Path(run_dir) / CONFIG_FILE, list(overrides))
    if overrides:
        save_config(cfg, Path(run_dir) / CONFIG_FILE)
    return train(cfg, model, rollout_fn, eval_fn, stateful, run_dir=run_dir, pad_id=pad_id,
                 resume=True)
