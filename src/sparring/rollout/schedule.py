"""The rollout schedule of a run: which episodes each training step plays, against whom.

Per step, each env spec of ``cfg.envs`` gets ``weight``-proportional episodes
(`episode_counts`, whole groups of ``group_size``), split evenly among its ``opponents``:

* ``self``: self-play, the training policy in every seat (each seat's turns are its own agent);
* ``pool``: the learner in a rotating seat against the opponent pool (bots of
  ``rollout.pool_bots`` and past snapshots of the policy, one added every
  ``rollout.pool_every`` steps, kept under ``RUN_DIR/pool``; see `Rollouts` for what stays
  on disk);
* a bot name (`sparring.envs.bots.BOTS`): the learner in a rotating seat against that bot
  (`sparring.rollout.seating`).

Rollouts are deterministic in (``train.seed``, step): the sampler and the bots are reseeded
at every step, which makes a resumed run repeat an uninterrupted one. An env named by an
alias plays exactly as under its canonical name.
"""

from __future__ import annotations

import re
import shutil
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparring.data import Episode
from sparring.envs import env_entry, make
from sparring.envs.bots import BOTS, make_bot
from sparring.envs.invalid import InvalidActionPolicy
from sparring.policy.hf import HFPolicy
from sparring.policy.sampling import SamplingParams
from sparring.rollout.arena import Arena
from sparring.rollout.opponents import OpponentPool
from sparring.rollout.players import BotPlayer, ModelPlayer
from sparring.rollout.prompts import PromptConfig
from sparring.rollout.seating import rotating

if TYPE_CHECKING:
    from sparring.train.config import Config, EnvSpec, RolloutConfig

SPECIAL_OPPONENTS = ("self", "pool")  # opponent kinds besides the bots of BOTS
_SNAPSHOT_RE = re.compile(r"^step-(\d+)$")


def check_opponents(spec: EnvSpec) -> None:
    """Raise ValueError naming an opponent of ``spec`` that is neither special nor a bot."""
    for o in spec.opponents or ["self"]:
        if o not in SPECIAL_OPPONENTS and o not in BOTS:
            raise ValueError(f"envs[{spec.name}].opponents: unknown {o!r}; allowed: "
                             f"{', '.join(SPECIAL_OPPONENTS + tuple(BOTS.names()))}")


def episode_counts(cfg: Config) -> list[int]:
    """Episodes per env spec this step: ``weight``-proportional, multiples of group_size."""
    total_w = sum(s.weight for s in cfg.envs) or 1.0
    out = []
    for s in cfg.envs:
        n = cfg.rollout.episodes_per_step * s.weight / total_w
        out.append(max(s.group_size, int(round(n / s.group_size)) * s.group_size))
    return out


def make_arena(r: RolloutConfig) -> Arena:
    """The arena of ``rollout`` config ``r``: sampling, prompts, invalid actions, turn budget."""
    return Arena(
        sampling=SamplingParams(temperature=r.temperature, max_new_tokens=r.max_new_tokens),
        prompt=PromptConfig(history=r.history, last_k=r.last_k,
                            max_prompt_tokens=r.max_prompt_tokens, system_prompt=r.system_prompt),
        invalid=InvalidActionPolicy(r.invalid_action, r.invalid_penalty, r.max_retries),
        max_turns=r.max_turns)


def stable_seed(*parts: Any) -> int:
    """A seed from ``parts`` that is the same in every process (unlike ``hash`` of a str)."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


class Rollouts:
    """The rollout function of one run, ``rollouts(step) -> episodes``, and its state (the
    opponent pool, checkpointed through `state_dict`).

    Pool snapshots live in ``RUN_DIR/pool/step-NNNNNN`` and the pool records them relative
    to the run folder (``pool/step-NNNNNN``), so a run folder can be moved or resumed from
    another working directory. Disk: at the start of each step (the state a checkpoint or
    a crash checkpoint of the previous step saves) every snapshot the pool no longer holds
    is deleted, except those the pool of a kept checkpoint holds (the ``pool_max`` newest
    before the oldest checkpoint in ``RUN_DIR/checkpoints``, and any later one), so every
    kept checkpoint can resume; at most ``pool_max + 1`` (the one the newest snapshot
    replaced) plus those. Temporaries of a snapshot write that was killed (``*.tmp``) are
    removed on the first step, when the run folder is locked by the training loop.
    """

    def __init__(self, cfg: Config, policy: HFPolicy, run_dir: Path):
        self.cfg, self.policy, self.run_dir = cfg, policy, Path(run_dir)
        r = cfg.rollout
        self.arena = make_arena(r)
        self.learner = ModelPlayer(policy, name="learner", train=True)
        self.pool = OpponentPool(mode=r.pool_mode, max_checkpoints=r.pool_max,
                                 seed=cfg.train.seed, loader=self._load_snapshot)
        unknown = [name for name in r.pool_bots if name not in BOTS]
        if unknown:
            raise ValueError(f"rollout.pool_bots: unknown {', '.join(map(repr, unknown))}; "
                             f"allowed: {', '.join(BOTS.names())}")
        self.pool_bots = {name: make_bot(name, cfg.train.seed) for name in r.pool_bots}
        for name, bot in self.pool_bots.items():
            self.pool.add_bot(BotPlayer(bot, name=name))
        for spec in cfg.envs:
            check_opponents(spec)
        self.bots = {name: make_bot(name, cfg.train.seed) for s in cfg.envs
                     for name in s.opponents if name in BOTS}
        self.env_names = [env_entry(s.name).name for s in cfg.envs]  # canonical, per spec
        self.num_seats = [make(s.name, **s.options).num_seats for s in cfg.envs]  # per spec
        self._step = 0
        self._tidied = False

    def _load_snapshot(self, path: str) -> HFPolicy:
        m = self.cfg.model
        p = HFPolicy.from_pretrained(self.run_dir / path, device=m.device, dtype=m.dtype,
                                     seed=self._snapshot_seed(path), name=Path(path).name)
        p.tokenizer = self.policy.tokenizer
        return p

    def _snapshot_seed(self, path: str) -> int:
        """A snapshot's sampling seed depends only on (step, snapshot), not on when it was
        loaded, so a resumed run (empty snapshot cache) samples as an uninterrupted one."""
        return stable_seed(self.cfg.train.seed, self._step, Path(path).name)

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
        self.pool.add_checkpoint(folder.relative_to(self.run_dir).as_posix(), step)

    def _snapshots(self) -> list[tuple[int, Path]]:
        """(step, folder) of the snapshots on disk, oldest first."""
        root = self.run_dir / "pool"
        found = [(int(m.group(1)), p) for p in root.iterdir()
                 if p.is_dir() and (m := _SNAPSHOT_RE.match(p.name))] if root.is_dir() else []
        return sorted(found)

    def _tidy_pool(self) -> None:
        """Delete killed writes (``*.tmp``) and the snapshots no one can sample (see the
        class docstring)."""
        from sparring.train.checkpoint import step_dirs

        root = self.run_dir / "pool"
        if not root.is_dir():
            return
        if not self._tidied:
            for p in root.glob("*.tmp"):
                shutil.rmtree(p, ignore_errors=True)
            self._tidied = True
        snaps = self._snapshots()
        live = {Path(c.path).name for c in self.pool.checkpoints}
        kept = [s for s, _ in step_dirs(self.run_dir)]
        need_from = None  # snapshots from this step on may be in a kept checkpoint's pool
        if kept:
            older = [s for s, _ in snaps if s < kept[0]]
            window = older[-self.pool.max_checkpoints:] if self.pool.max_checkpoints else older
            need_from = window[0] if window else kept[0]
        for step, folder in snaps:
            if folder.name not in live and (need_from is None or step < need_from):
                shutil.rmtree(folder, ignore_errors=True)

    def __call__(self, step: int) -> list[Episode]:
        self._reseed(step)
        self._tidy_pool()
        self._snapshot(step)
        episodes: list[Episode] = []
        group = 0
        for spec, name, n, num_seats in zip(self.cfg.envs, self.env_names,
                                            episode_counts(self.cfg), self.num_seats):
            kinds = spec.opponents or ["self"]
            n_groups = n // spec.group_size
            for k, kind in enumerate(kinds):
                g = n_groups // len(kinds) + (1 if k < n_groups % len(kinds) else 0)
                if g == 0:
                    continue
                seeds = [stable_seed(self.cfg.train.seed, step, name, k, j) for j in range(g)]
                kw: dict[str, Any] = dict(seeds=seeds, group_size=spec.group_size,
                                          group_offset=group)
                if kind == "self":
                    kw["seat_players"] = self.learner
                elif kind == "pool":
                    kw["players_fn"] = self.pool.players_fn(self.learner, num_seats)
                else:
                    bot = BotPlayer(self.bots[kind], name=kind)
                    kw["players_fn"] = rotating(self.learner, lambda bot=bot: bot, num_seats)
                episodes += self.arena.play(name, dict(spec.options), **kw)
                group += g
        return episodes

    def state_dict(self) -> dict[str, Any]:
        return {"pool": self.pool.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pool = dict(state["pool"])
        # runs saved before paths were relative recorded RUN_DIR/pool/step-N as given
        pool["checkpoints"] = [{**c, "path": f"pool/{Path(c['path']).name}"}
                               if Path(c["path"]).parent.name == "pool" else c
                               for c in pool["checkpoints"]]
        self.pool.load_state_dict(pool)
