"""Wire a `Config` into the training loop: model, rollouts, opponents and evaluation.

``build(cfg, run_dir) -> {"model", "rollout_fn", "eval_fn", "stateful", "pad_id", "policy"}``
is what ``sparring train`` calls. Per step, each env spec of ``cfg.envs`` gets
``weight``-proportional episodes, split evenly among its ``opponents``:

* ``self``: self-play, the training policy in every seat (each seat's turns are its own agent);
* ``pool``: the learner in a rotating seat against the opponent pool (bots of
  ``rollout.pool_bots`` and past snapshots of the policy, one added every
  ``rollout.pool_every`` steps, kept under ``RUN_DIR/pool``);
* a bot name (`BOTS`): the learner in a rotating seat against that bot.

Rollouts are deterministic in (``train.seed``, step): the sampler and the bots are reseeded
at every step, which makes a resumed run repeat an uninterrupted one. Evaluation plays
``eval.games`` games per (game, opponent bot) with the learner's seat rotating (greedy by
default) and reports win / draw / loss and the non-loss rate with Wilson 95% intervals.
"""

from __future__ import annotations

import shutil
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparring.data import Episode
from sparring.envs import make
from sparring.envs.bots import CFRBot, MCTSBot, MinimaxBot, RandomBot
from sparring.envs.invalid import InvalidActionPolicy
from sparring.policy.hf import HFPolicy
from sparring.policy.sampling import SamplingParams
from sparring.rollout.arena import Arena
from sparring.rollout.opponents import OpponentPool
from sparring.rollout.players import BotPlayer, ModelPlayer
from sparring.rollout.prompts import PromptConfig
from sparring.train.config import Config, EnvSpec
from sparring.train.eval_games import evaluate_vs_bot

BOTS: dict[str, Callable[[int], Any]] = {
    "random": lambda seed: RandomBot(seed=seed),
    "minimax": lambda seed: MinimaxBot(seed=seed),
    "mcts": lambda seed: MCTSBot(simulations=100, seed=seed),
    "cfr": lambda seed: CFRBot(seed=seed),
}
SPECIAL_OPPONENTS = ("self", "pool")


def load_model(cfg: Config) -> tuple[Any, Any]:
    """``model.name``: 'tiny' (built from ``model.options``), 'smollm2', or an HF folder/id."""
    m = cfg.model
    if m.name == "tiny":
        from sparring.policy.tiny import build_tiny_model

        return build_tiny_model(dict(m.options))
    if m.name == "smollm2":
        from sparring.policy.smollm2 import smollm2_folder

        path = smollm2_folder()
    else:
        path = m.name
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=m.trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=m.trust_remote_code)
    return model, tok


def check_opponents(spec: EnvSpec) -> None:
    for o in spec.opponents or ["self"]:
        if o not in SPECIAL_OPPONENTS and o not in BOTS:
            raise ValueError(f"envs[{spec.name}].opponents: unknown {o!r}; allowed: "
                             f"{', '.join(SPECIAL_OPPONENTS + tuple(BOTS))}")


def episode_counts(cfg: Config) -> list[int]:
    """Episodes per env spec this step: ``weight``-proportional, multiples of group_size."""
    total_w = sum(s.weight for s in cfg.envs) or 1.0
    out = []
    for s in cfg.envs:
        n = cfg.rollout.episodes_per_step * s.weight / total_w
        out.append(max(s.group_size, int(round(n / s.group_size)) * s.group_size))
    return out


def make_arena(cfg: Config) -> Arena:
    """The arena of ``cfg.rollout``: sampling, prompts, invalid-action policy, turn budget."""
    r = cfg.rollout
    return Arena(
        sampling=SamplingParams(temperature=r.temperature, max_new_tokens=r.max_new_tokens),
        prompt=PromptConfig(history=r.history, last_k=r.last_k,
                            max_prompt_tokens=r.max_prompt_tokens, system_prompt=r.system_prompt),
        invalid=InvalidActionPolicy(r.invalid_action, r.invalid_penalty, r.max_retries),
        max_turns=r.max_turns)


class Rollouts:
    """The rollout function and its state (the opponent pool) for one run."""

    def __init__(self, cfg: Config, policy: HFPolicy, run_dir: Path):
        self.cfg, self.policy, self.run_dir = cfg, policy, Path(run_dir)
        r = cfg.rollout
        self.arena = make_arena(cfg)
        self.learner = ModelPlayer(policy, name="learner", train=True)
        self.pool = OpponentPool(mode=r.pool_mode, max_checkpoints=r.pool_max,
                                 seed=cfg.train.seed, loader=self._load_snapshot)
        self.pool_bots = {name: BOTS[name](cfg.train.seed) for name in r.pool_bots}
        for name, bot in self.pool_bots.items():
            self.pool.add_bot(BotPlayer(bot, name=name))
        for spec in cfg.envs:
            check_opponents(spec)
        self.bots = {name: BOTS[name](cfg.train.seed) for s in cfg.envs for name in s.opponents
                     if name in BOTS}
        self.num_seats = [make(s.name, **s.options).num_seats for s in cfg.envs]  # per spec

    def attach_learner(self, learner: Any) -> None:
        """Called by the training loop: evaluation can then score the learner's magnet."""
        self.learner_obj = learner

    def average_policy(self) -> HFPolicy | None:
        """The magnet (an exponential moving average of the policy's weights, i.e. an
        average of recent policies) as a policy, when the run has one."""
        lrn = getattr(self, "learner_obj", None)
        if lrn is None or lrn.ref_model is None or self.cfg.algorithm.kl.reference != "magnet":
            return None
        return HFPolicy(lrn.ref_model, self.policy.tokenizer, device=self.cfg.model.device,
                        name="magnet")

    def _load_snapshot(self, path: str) -> HFPolicy:
        p = HFPolicy.from_pretrained(path, seed=self._snapshot_seed(path), name=Path(path).name)
        p.tokenizer = self.policy.tokenizer
        return p

    def _snapshot_seed(self, path: str) -> int:
        """A snapshot's sampling seed depends only on (step, snapshot), not on when it was
        loaded, so a resumed run (empty snapshot cache) samples as an uninterrupted one."""
        return _stable_seed(self.cfg.train.seed, getattr(self, "_step", 0), Path(path).name)

    def _reseed(self, step: int) -> None:
        self._step = step
        base = self.cfg.train.seed * 1_000_003 + step * 7919
        self.policy.generator.manual_seed(base)
        for k, bot in enumerate([*self.bots.values(), *self.pool_bots.values()]):
            bot.rng.seed(base + 101 * (k + 1))
        for path, player in self.pool._cache.items():  # snapshots loaded in earlier steps
            player.policy.generator.manual_seed(self._snapshot_seed(path))

    def _snapshot(self, step: int) -> None:
        every = self.cfg.rollout.pool_every
        if not every or step == 0 or step % every or not any(
                "pool" in s.opponents for s in self.cfg.envs):
            return
        folder = self.run_dir / "pool" / f"step-{step:06d}"
        tmp = folder.with_name(folder.name + ".tmp")  # written whole, then renamed: a kill
        shutil.rmtree(tmp, ignore_errors=True)        # mid-save leaves no half snapshot
        self.policy.model.save_pretrained(tmp)
        self.policy.tokenizer.save_pretrained(tmp)
        shutil.rmtree(folder, ignore_errors=True)  # a resumed run rewrites its own snapshot
        tmp.rename(folder)
        self.pool.add_checkpoint(str(folder), step)

    def __call__(self, step: int) -> list[Episode]:
        self._reseed(step)
        self._snapshot(step)
        episodes: list[Episode] = []
        group = 0
        for spec, n, num_seats in zip(self.cfg.envs, episode_counts(self.cfg), self.num_seats):
            kinds = spec.opponents or ["self"]
            n_groups = n // spec.group_size
            for k, kind in enumerate(kinds):
                g = n_groups // len(kinds) + (1 if k < n_groups % len(kinds) else 0)
                if g == 0:
                    continue
                seeds = [_stable_seed(self.cfg.train.seed, step, spec.name, k, j)
                         for j in range(g)]
                kw: dict[str, Any] = dict(seeds=seeds, group_size=spec.group_size,
                                          group_offset=group)
                if kind == "self":
                    kw["seat_players"] = self.learner
                elif kind == "pool":
                    kw["players_fn"] = self.pool.players_fn(self.learner, num_seats)
                else:
                    bot = BotPlayer(self.bots[kind], name=kind)
                    kw["players_fn"] = _rotating(self.learner, bot, num_seats)
                episodes += self.arena.play(spec.name, dict(spec.options), **kw)
                group += g
        return episodes

    def state_dict(self) -> dict[str, Any]:
        return {"pool": self.pool.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pool.load_state_dict(state["pool"])


def _stable_seed(*parts: Any) -> int:
    """A seed from ``parts`` that is the same in every process (unlike ``hash`` of a str)."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def _rotating(learner: ModelPlayer, other: Any, num_seats: int) -> Callable[[int], list[Any]]:
    """Episode i: the learner in seat ``i % num_seats``, ``other`` everywhere else."""
    return lambda i: [learner if s == i % num_seats else other for s in range(num_seats)]


def make_eval_fn(cfg: Config, rollouts: Rollouts) -> Callable[[int], dict[str, Any]]:
    e = cfg.eval
    sampling = SamplingParams(temperature=cfg.rollout.temperature, greedy=e.greedy,
                              max_new_tokens=cfg.rollout.max_new_tokens)
    games = list(dict.fromkeys(s.name for s, seats in zip(cfg.envs, rollouts.num_seats)
                               if seats >= 2))

    def eval_fn(step: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in games:
            for opp in e.opponents:
                if opp not in BOTS:
                    raise ValueError(f"eval.opponents: unknown {opp!r}; allowed: {', '.join(BOTS)}")
                res = evaluate_vs_bot(rollouts.arena, rollouts.policy, sampling, name,
                                      env_options(cfg, name), BOTS[opp](10_000 + step), e.games,
                                      seed=cfg.train.seed + 1_000_000)
                out.update({f"{name}/{opp}/{k}": v for k, v in res.items()})
            if e.exploitability and name in ("kuhn_poker", "leduc"):
                from sparring.train.eval_games import policy_exploitability

                out[f"{name}/exploitability"] = policy_exploitability(
                    rollouts.arena, rollouts.policy, name, env_options(cfg, name))
                avg = rollouts.average_policy()
                if avg is not None:
                    out[f"{name}/exploitability_average"] = policy_exploitability(
                        rollouts.arena, avg, name, env_options(cfg, name))
        return out

    return eval_fn


def env_options(cfg: Config, name: str) -> dict[str, Any]:
    """The options of env ``name`` in ``cfg`` (its first spec), {} when it is not there."""
    return next((dict(s.options) for s in cfg.envs if s.name == name), {})


class EstimatorState:
    """Run-time estimator state that lives across steps and in checkpoints: for
    ``role_ema``, the per-(env, role) EMA baselines (SPIRAL), passed as ``tracker``."""

    def __init__(self, cfg: Config):
        from sparring.advantages.turn import RoleEMA

        o = cfg.algorithm.estimator_options
        self.tracker = RoleEMA(decay=o.get("decay", 0.95), init=o.get("init", 0.0))

    def estimator_options(self) -> dict[str, Any]:
        return {"tracker": self.tracker}

    def state_dict(self) -> dict[str, Any]:
        return self.tracker.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tracker.load_state_dict(state)


def build(cfg: Config, run_dir: str | Path | None = None) -> dict[str, Any]:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # pool snapshots save/load every few steps
    if not cfg.envs:
        raise ValueError("config has no envs: add at least one, e.g. envs: [{name: tictactoe}]")
    model, tok = load_model(cfg)
    policy = HFPolicy(model, tok, device=cfg.model.device, seed=cfg.train.seed, name="learner")
    rollouts = Rollouts(cfg, policy, Path(run_dir or "runs/unnamed"))
    stateful: dict[str, Any] = {"rollouts": rollouts}
    if cfg.algorithm.estimator == "role_ema":
        stateful["estimator"] = EstimatorState(cfg)
    return {"model": policy.model, "policy": policy, "rollout_fn": rollouts,
            "eval_fn": make_eval_fn(cfg, rollouts), "stateful": stateful,
            "pad_id": policy.pad_id, "tokenizer": tok}
