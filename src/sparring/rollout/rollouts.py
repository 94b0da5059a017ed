"""The rollout schedule of a run: which episodes each training step plays, against whom.

Per step, each env spec of ``cfg.envs`` gets ``weight``-proportional episodes
(`episode_counts`, whole groups of ``group_size``), split evenly among its ``opponents``:

* ``self``: self-play, the training policy in every seat (each seat's turns are its own agent);
* ``pool``: the learner in a rotating seat against the opponent pool (bots of
  ``league.bots`` and past snapshots of the policy, one added every
  ``league.every`` steps, kept under ``RUN_DIR/pool``; see `sparring.rollout.snapshots`
  for what stays on disk);
* a bot name (`sparring.envs.bots.BOTS`): the learner in a rotating seat against that bot
  (`sparring.rollout.seating`).

Several policies (``policies`` and ``envs[].seats``): `Rollouts` takes ``{name: policy}``;
seat ``s`` of an env is played by the policy ``seats[s]`` names (a `ModelPlayer` named
after it, so `sparring.data.collate` records the policy of every row): in every seat for
``self``, in the rotating seat against a bot. The arena batches each turn's generations
per policy. Against ``pool`` each policy has a pool of its own (the same bots, its own
snapshots ``RUN_DIR/pool/step-NNNNNN.NAME``, ``league.max`` of them; with
``lora.shared_base`` adapters of the one model): the rotating seat is played by its policy
and every other seat by a draw from the pool of that seat's policy.

Rollouts are deterministic in (``train.seed``, step), group by group: a step is a list of
`GroupTask`s (`group_tasks`), and each group's start state, model samples (one random stream
per episode turn, `Arena.run_episodes`'s ``sample_seeds``), bot moves and pool draws are seeded from
(``train.seed``, step, env, opponent kind, group index) alone. So a resumed run repeats an
uninterrupted one, and `Rollouts.collect` of any split of the tasks, concatenated in task
order, gives the same episodes as the whole step (what `sparring.distributed` relies on).
An env named by an alias plays exactly as under its canonical name. With
``envs[].starts`` (`sparring.envs.starts`) a spec's episodes start as its components say,
drawn from their reset seed, so a group shares its start: after a random or listed
opening, from a position of the loss replay (`sparring.envs.wrappers.RandomOpening`), each
seat through its own symmetric view (`sparring.envs.views.SymmetricViews`); see
`training_env`.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparring.config import ExplorationSpec
from sparring.config.plan import GroupTask, group_tasks
from sparring.data import Episode
from sparring.envs import env_entry, make
from sparring.envs.bots import BOTS, check_opponents, make_bot
from sparring.envs.invalid import InvalidActionPolicy
from sparring.envs.starts import LossReplayStart, Start, parse_starts, start_env
from sparring.policy.hf import HFPolicy
from sparring.policy.sampling import SamplingParams
from sparring.rollout.arena import Arena
from sparring.rollout.league import league_metrics, record_scores
from sparring.rollout.loss_replay import LossReplay, record_losses
from sparring.rollout.loss_replay import Start as Replayed
from sparring.rollout.opponents import OpponentPool
from sparring.rollout.players import BotPlayer, ModelPlayer
from sparring.rollout.prompts import PromptConfig
from sparring.rollout.seating import learner_seat, rotating
from sparring.rollout.snapshots import SnapshotStore, run_relative
from sparring.schedules import lr_at
from sparring.seeding import stable_seed

if TYPE_CHECKING:
    from sparring.config import Config, EnvSpec, RolloutConfig
    from sparring.envs.base import Env

SPECIAL_OPPONENTS = ("self", "pool")  # opponent kinds besides the bots of BOTS


def training_env(name: str, starts: Sequence[Start], replayed: Sequence[Replayed] = (),
                 **options: Any) -> Env:
    """Env ``name`` as a training episode plays it with the start components ``starts``
    (`sparring.envs.starts.start_env`); ``replayed``: the loss replay's positions."""
    return start_env(make(name, **options), starts, replayed)


def rollout_sampling(r: RolloutConfig, *, greedy: bool = False) -> SamplingParams:
    """How ``rollout`` config ``r`` samples a turn (evaluation and play too, ``greedy``
    there when asked): temperature, token budget, stop strings."""
    return SamplingParams(temperature=r.temperature, max_new_tokens=r.max_new_tokens,
                          stop=tuple(r.stop), greedy=greedy)


def make_arena(r: RolloutConfig) -> Arena:
    """The arena of ``rollout`` config ``r``: sampling, prompts, invalid actions, turn budget."""
    return Arena(
        sampling=rollout_sampling(r),
        prompt=PromptConfig(history=r.history, last_k=r.last_k,
                            max_prompt_tokens=r.max_prompt_tokens, system_prompt=r.system_prompt,
                            answer_prefix=r.answer_prefix),
        invalid=InvalidActionPolicy(r.invalid_action, r.invalid_penalty, r.max_retries),
        max_turns=r.max_turns, answer_format=r.answer_format, strict_format=r.strict_format)


class Rollouts:
    """The rollout function of one run, ``rollouts(step) -> episodes``, and its state (the
    opponent pools, checkpointed through `state_dict`). It plays a step's groups; the
    pools' snapshots on disk are ``snapshots`` (`sparring.rollout.snapshots.SnapshotStore`)
    and the learner's scores against the pools are `sparring.rollout.league`'s.

    Several policies: ``pools`` holds a pool per policy (one policy: ``{'': pool}``), and
    ``pool`` is the first policy's pool.
    """

    def __init__(self, cfg: Config, policy: HFPolicy | Mapping[str, HFPolicy], run_dir: Path):
        """``policy``: the run's policy (or ``{'': policy}``), or ``{name: policy}`` with
        several policies."""
        given = dict(policy) if isinstance(policy, Mapping) else {"": policy}
        self.policies = {} if list(given) == [""] else given
        self.policy = next(iter(given.values()))
        self.cfg, self.run_dir = cfg, Path(run_dir)
        r, lg = cfg.rollout, cfg.league
        mine, theirs = (cfg.exploration.get(who, ExplorationSpec())
                        for who in ("learner", "league"))
        self.arena = make_arena(r)
        self.learner = ModelPlayer(self.policy, name="learner", train=True,
                                   explore_turns=mine.turns, explore_tactical=mine.tactical)
        players = {n: ModelPlayer(p, name=n, train=True, explore_turns=mine.turns,
                                  explore_tactical=mine.tactical)
                   for n, p in self.policies.items()}
        # their epsilon (exploration.learner) is set per step in _reseed
        self.players = players
        # per env spec, the player of each seat (several policies), else None
        self.seat_players = [[players[n] for n in s.seats] if players else None
                             for s in cfg.envs]
        self.snapshots = SnapshotStore(cfg, self.run_dir, self.policies or {"": self.policy})
        # a pool per policy ('' for the one policy of a run), the same bots in each
        self.pools = {n: OpponentPool(mode=lg.mode, max_checkpoints=lg.max,
                                      seed=cfg.train.seed, loader=self.snapshots.load,
                                      unloader=self.snapshots.unload,
                                      cache_size=lg.cache or lg.max,
                                      explore=theirs.rate, explore_turns=theirs.turns,
                                      explore_tactical=theirs.tactical,
                                      power=lg.pfsp_power,
                                      score_rate=lg.score_rate)
                      for n in (self.policies or [""])}
        self.pool = next(iter(self.pools.values()))
        check_opponents("league.bots", lg.bots)
        self.pool_bots = {name: make_bot(name, cfg.train.seed) for name in lg.bots}
        for name, bot in self.pool_bots.items():
            for pool in self.pools.values():
                pool.add_bot(BotPlayer(bot, name=name))
        for spec in cfg.envs:  # every bot can play the games it meets honestly
            game = make(spec.name, **spec.options)
            check_opponents(f"envs[{spec.name}].opponents", spec.opponents, SPECIAL_OPPONENTS,
                            game)
            if "pool" in spec.opponents:
                check_opponents("league.bots", lg.bots, game=game)
        self.bots = {name: make_bot(name, cfg.train.seed) for s in cfg.envs
                     for name in s.opponents if name in BOTS}
        self.env_names = [env_entry(s.name).name for s in cfg.envs]  # canonical, per spec
        self.num_seats = [make(s.name, **s.options).num_seats for s in cfg.envs]  # per spec
        self.starts = [parse_starts(s.starts) for s in cfg.envs]  # per spec, its components
        # per spec index with a loss_replay start, its replayed positions
        self.replays = {i: LossReplay(p.size, p.depth) for i, parts in enumerate(self.starts)
                        for p in parts if isinstance(p, LossReplayStart)}
        self.replayed_share: dict[int, float] = {}  # per spec, in the last recorded step

    def _reseed(self, step: int) -> None:
        """The policies' own generators, for backends without per-prompt seeds (their
        samples then depend on the batch; `HFPolicy` takes seeds and does not use these),
        the training players' epsilon (``exploration.learner``) and the pools' snapshots'
        (``exploration.league``) at ``step``."""
        self.snapshots.step = step  # what seeds the snapshots loaded during this step
        self.policy.generator.manual_seed(self.cfg.train.seed * 1_000_003 + step * 7919)
        for name, p in self.policies.items():
            p.generator.manual_seed(stable_seed(self.cfg.train.seed, step, name))
        explore, own = self._explore_rate("league", step), self._explore_rate("learner", step)
        for player in [self.learner, *self.players.values()]:  # their own seats
            player.explore = own
        for pool in self.pools.values():  # snapshots loaded in earlier steps
            pool.set_explore(explore)
            for path, player in pool.loaded().items():
                player.policy.generator.manual_seed(self.snapshots.seed(path))

    def _explore_rate(self, who: str, step: int) -> float:
        """The epsilon of ``who`` (an entry of ``exploration``) at ``step``: its rate on its
        schedule; 0 without an entry."""
        e = self.cfg.exploration.get(who)
        if e is None:
            return 0.0
        return lr_at(step, lr=e.rate, schedule=e.schedule, total_steps=self.cfg.train.steps,
                     final_ratio=e.final_ratio)

    def __call__(self, step: int) -> list[Episode]:
        """Step ``step``'s episodes: `begin_step`, every group, then `record`."""
        self.begin_step(step)
        episodes = self.collect(step, group_tasks(self.cfg))
        self.record(episodes)
        return episodes

    def record(self, episodes: Sequence[Episode]) -> None:
        """The learner's score against each pool entry it met in ``episodes`` (a step's,
        from any split of its groups), into the pools (`sparring.rollout.league.record_scores`);
        the positions its trained seats lost from, into the loss replays
        (`sparring.rollout.loss_replay.record_losses`)."""
        trainers = {self.learner.name, *self.policies}
        record_scores(self.pools, self.cfg, episodes, trainers)
        if self.replays:
            self.replayed_share = record_losses(self.replays, self.cfg, episodes, trainers)

    def league_metrics(self) -> dict[str, float]:
        """The league's scores as the loop logs them (`sparring.rollout.league.league_metrics`)
        and, per env spec with loss replay, its buffer's positions and the share of the last
        step's episodes that started from one (``loss_replay/<env>/positions``, ``/share``;
        ``<env>.<index>`` where two specs play one env)."""
        out = league_metrics(self.pools)
        for i, replay in self.replays.items():
            name = self.env_names[i]
            if self.env_names.count(name) > 1:
                name = f"{name}.{i}"
            out[f"loss_replay/{name}/positions"] = float(len(replay))
            out[f"loss_replay/{name}/share"] = self.replayed_share.get(i, 0.0)
        return out

    def begin_step(self, step: int) -> None:
        """The pool's upkeep at the start of ``step`` (tidy the snapshots, take this step's
        one), done once per step by whoever owns the pool (the driver, with workers)."""
        self._reseed(step)
        self.snapshots.tidy(self.pools)
        self.snapshots.write(step, self.pools)

    def collect(self, step: int, tasks: Sequence[GroupTask]) -> list[Episode]:
        """The episodes of ``tasks`` (groups of `group_tasks`) at ``step``, in task order;
        the same episodes whichever other groups are played with them. Consecutive groups
        of one env spec share one `Arena.run_episodes`, whatever their opponents, so each
        turn's generations are one batched call per policy."""
        self._reseed(step)
        self.snapshots.release(self.pools)  # the snapshot adapters the pools let go
        episodes: list[Episode] = []
        run: list[GroupTask] = []
        for t in [*tasks, None]:
            if run and (t is None or (t.spec, t.group) != (run[-1].spec, run[-1].group + 1)):
                episodes += self._play_run(step, run)
                run = []
            if t is not None:
                run.append(t)
        return episodes

    def _play_run(self, step: int, run: list[GroupTask]) -> list[Episode]:
        """Consecutive groups of one env spec in one `Arena.run_episodes`. Per group: its
        start seed and sample seed (from its opponent kind and its index among that kind's
        groups), its own copies of the bots (their RNGs seeded per group) and its own RNG
        for pool draws; the learner's seat rotates with the episode's index among its
        kind's episodes of the step."""
        spec = self.cfg.envs[run[0].spec]
        name, num_seats = self.env_names[run[0].spec], self.num_seats[run[0].spec]
        kinds = spec.opponents or ["self"]
        seeds = [stable_seed(self.cfg.train.seed, step, name, t.kind, t.index) for t in run]
        learner = self.seat_players[run[0].spec] or self.learner
        choosers = [None if kinds[t.kind] == "self"
                    else self._chooser(kinds[t.kind], s, learner, spec, num_seats)
                    for t, s in zip(run, seeds)]
        gs = spec.group_size

        def players(i: int) -> Any:  # i: the episode's index in this call
            t, m = divmod(i, gs)
            chooser = choosers[t]
            return learner if chooser is None else chooser(run[t].index * gs + m)

        kw: dict[str, Any] = dict(seeds=seeds, group_size=gs, group_offset=run[0].group,
                                  sample_seeds=[stable_seed(s, "sample") for s in seeds],
                                  players_fn=players)
        starts = self.starts[run[0].spec]
        if starts:
            replay = self.replays.get(run[0].spec)
            replayed = replay.starts() if replay is not None else ()
            return self.arena.run_episodes(partial(training_env, name, starts, replayed),
                                           dict(spec.options), **kw)
        return self.arena.run_episodes(name, dict(spec.options), **kw)

    def _chooser(self, kind: str, seed: int, learner: Any, spec: EnvSpec,
                 num_seats: int) -> Any:
        """A group's `rotating` chooser against ``kind`` (the learner's seats in
        ``spec.learner_seats`` order, else every seat in turn); with several policies
        against the pool, every other seat ``s`` is drawn from the pool of its policy
        ``spec.seats[s]`` (in seat order, from the group's one RNG)."""
        draw = self._opponents(kind, seed)
        order = spec.learner_seats or None
        if not (self.policies and kind == "pool"):
            return rotating(learner, draw, num_seats, order)

        def choose(i: int) -> list[Any]:
            me = learner_seat(i, num_seats, order)
            return [learner[s] if s == me else draw(spec.seats[s]) for s in range(num_seats)]

        return choose

    def _opponents(self, kind: str, seed: int) -> Any:
        """A group's opponent chooser for ``kind``: a bot of its own, or draws from the pool
        with the group's RNG (pool bots: the group's own copies); with several policies a
        pool draw takes the name of the policy whose pool it draws from."""
        def group_bot(bot: Any, name: str) -> BotPlayer:
            mine = copy.copy(bot)  # shares its memo tables, not its RNG
            mine.rng = random.Random(stable_seed(seed, "bot", name))
            return BotPlayer(mine, name=name)

        if kind != "pool":
            player = group_bot(self.bots[kind], kind)
            return lambda: player
        rng = random.Random(stable_seed(seed, "pool"))
        mine = {p.name: group_bot(p.fn, p.name) for p in self.pool.bots}

        def draw(policy: str = "") -> Any:
            p = (self.pools[policy] if policy else self.pool).sample(rng)
            return mine[p.name] if isinstance(p, BotPlayer) else p

        return draw

    def state_dict(self) -> dict[str, Any]:
        """``{'pool': state}``; with several policies ``{'pools': {name: state}}``; with loss
        replay, its buffers too (``'loss_replay'``: spec index -> state)."""
        out: dict[str, Any] = {}
        if self.replays:
            out["loss_replay"] = {str(i): r.state_dict() for i, r in self.replays.items()}
        if self.policies:
            return {"pools": {n: pool.state_dict() for n, pool in self.pools.items()}, **out}
        return {"pool": self.pool.state_dict(), **out}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for i, replay in self.replays.items():  # a checkpoint from before loss replay: empty
            replay.load_state_dict(state.get("loss_replay", {}).get(str(i), {"entries": []}))
        if self.policies:
            if set(state.get("pools", {})) != set(self.pools):
                raise ValueError(f"rollouts state has pools {sorted(state.get('pools', {}))}, "
                                 f"this run's policies are {sorted(self.pools)}")
            for n, pool in self.pools.items():
                pool.load_state_dict(state["pools"][n])
            return
        pool = dict(state["pool"])
        pool["checkpoints"] = run_relative(pool["checkpoints"])  # older runs' records
        self.pool.load_state_dict(pool)
