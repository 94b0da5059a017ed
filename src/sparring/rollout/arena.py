"""The arena: plays many episodes at once, one batched generate call per policy per step.

    arena = Arena(sampling=SamplingParams(max_new_tokens=16), prompt=PromptConfig("full"),
                  invalid=InvalidActionPolicy("retry"), max_turns=50)
    episodes = arena.run_episodes("tictactoe", env_options={}, seeds=[0, 1], group_size=8,
                          seat_players=policy)          # self-play: the policy in every seat

``play`` runs ``len(seeds) * group_size`` episodes; episode ``j * group_size + g`` starts
from ``seeds[j]`` and has ``group = group_offset + j`` (a group: same start state, so
group-relative estimators compare its members; in self-play the seats of one episode share
the group id and ``Turn.agent`` = seat tells them apart). ``seat_players`` is one player
for every seat (self-play) or a list with one player per seat; alternatively
``players_fn(episode_index) -> list of players`` chooses per episode (e.g. opponents
sampled from an `OpponentPool`). ``sample_seeds`` (one per entry of ``seeds``) gives every
model turn its own random stream, seeded from (its group's sample seed, the episode's index
in the group, the turn's index), for policies whose ``generate`` takes ``seeds``: an
episode then plays the same whatever else shares the batch, which lets a step's groups be
split among rollout workers (`sparring.distributed`). Without it (or for a policy without
``seeds``) model seats draw from their policy's generator in batch order.
Players: see `sparring.rollout.players` (a bare policy or bot callable is accepted).

Each step, every unfinished episode's current seat is served: bots act at once, and so
does a model player with ``explore`` = epsilon when its turn's draw (seeded from the
episode's sample seed, or its seed and group, and the turn index) falls under epsilon
(with ``explore_turns`` = N, only among its first N turns): it plays a uniformly random
legal action (a training player's is a row, written in the answer format, see
`sparring.rollout.players`). An env without legal actions but with ``action_prefixes``
under constrained decoding gets a uniformly random one of those (where it offers more
than one), and the model writes the rest in the batched call below; the row records every
prefix as allowed, so the learner weighs the drawn word against the others, and carries
no sampler log-probs. Other model seats are gathered, per (policy,
sampling) pair, into one ``generate`` call over all episodes. The action text is parsed
by ``env.parse``; invalid actions follow the `InvalidActionPolicy`: ``forfeit`` (penalty,
episode ends, ``info["forfeit"] = seat``),
``retry`` (penalty, the seat is asked again with the parser's error shown before the
observation, at most ``max_retries`` times per move, then forfeit), ``constrained``
(model seats sample only legal actions; an env with free-text moves that declares
``action_prefixes`` gets one of those spelt and the rest free; other envs without
``legal_actions`` are unconstrained; an action that still fails to parse forfeits).

Reward crediting rule: a step's reward for the acting seat goes to that seat's turn; a
reward another seat receives at that step (e.g. at game end) goes to that seat's most
recent turn, or, if it has not acted yet, to its next turn (and only to ``returns`` if
it never acts). Invalid-action penalties go to the offending turn. ``Episode.returns``
are the per-seat totals of all these rewards; ``info["env_returns"]`` is the game's own
score (``env.returns()``, no penalties). ``info["players"]`` names each seat's player;
``info["outcome"]`` is the info of the env's step that ended the episode (e.g. a task's
``correct``), when it gave any.
An env with a ``start_record()`` (a training start, `sparring.envs.wrappers.RandomOpening`)
leaves it in ``info["start"]``: how to replay the episode's positions.

Turn fields: ``prompt_ids`` and ``action_ids`` (exact sampled tokens; empty for bots and
``train=False`` players), ``logprobs``/``entropies``/``allowed_ids`` from the generation,
``state_key`` (env state before the action), ``reward``, ``done`` (this turn ended the
episode), ``invalid`` ("illegal"/"unparsable"), ``prompt_text``/``action_text`` and
``extras["prompt_truncated"] = 1.0`` when the prompt hit ``max_prompt_tokens``.
``max_turns`` stops an episode (``Episode.truncated = True``).
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparring.data import Episode, Turn
from sparring.envs.base import Env, ParseResult, action_prefixes
from sparring.envs.invalid import InvalidActionPolicy, retry_feedback
from sparring.envs.lookahead import tactical_actions
from sparring.envs.parsing import strict_answer
from sparring.policy.sampling import ActionPrefixes, Generation, SamplingParams, TokenTrie
from sparring.rollout.players import BotPlayer, ModelPlayer, Player, as_player
from sparring.rollout.prompts import Exchange, PromptBuilder, PromptConfig, Rendered
from sparring.seeding import stable_seed

SeatPlayers = Any  # a player (every seat) or a list of players (one per seat)
_BUILDERS = 64  # prompt builders an arena keeps (`Arena._builder`)


@dataclass
class _Slot:
    """One running episode."""

    env: Env
    ep: Episode
    players: list[Player]
    hist: list[list[Exchange]]
    last: list[int | None]  # index in ep.turns of each seat's latest turn
    pending: list[float]  # rewards received before a seat's first turn
    totals: list[float]
    retries: int = 0
    feedback: str = ""
    done: bool = False
    sample_seed: int | None = None  # the episode's random stream (see Arena.run_episodes)
    explore_seed: int = 0  # the stream of an exploring player's draws (ModelPlayer.explore)
    req: dict[str, Any] = field(default_factory=dict)


class Arena:
    """Plays batches of episodes. Defaults apply to model players without overrides."""

    def __init__(self, sampling: SamplingParams | None = None, prompt: PromptConfig | None = None,
                 invalid: InvalidActionPolicy | None = None, max_turns: int = 100,
                 answer_format: str = "{}", strict_format: bool = False):
        """``answer_format``: how a model writes a move in its answer ("{}": the bare move,
        as constrained decoding samples it; "<answer>{}</answer>" for a free-decoding
        recipe); the exact evaluations (`sparring.eval.games`) score each legal move in it.
        ``strict_format``: a model's answer counts only when it is exactly that format
        around one move the env reads as written (`sparring.envs.parsing.strict_answer`);
        anything else is an invalid answer ("unparsable"), so a move named somewhere in
        prose plays nothing."""
        if max_turns < 1:
            raise ValueError(f"max_turns={max_turns}; must be >= 1")
        if answer_format.count("{}") != 1:
            raise ValueError(f"answer_format={answer_format!r}: needs exactly one {{}}, "
                             "where the move goes")
        self.prompt = prompt or PromptConfig()
        prefix = self.prompt.answer_prefix
        if not answer_format.split("{}")[0].startswith(prefix):
            raise ValueError(f"answer_prefix={prefix!r} must start answer_format="
                             f"{answer_format!r} (the text before the move), since every "
                             "answer starts with it")
        self.answer_format = answer_format
        self.strict_format = strict_format
        self.sampling = sampling or SamplingParams()
        self.invalid = invalid or InvalidActionPolicy()
        self.max_turns = max_turns
        # ids of (tokenizer, prompt config) -> their builder, kept across runs: its memos
        # of rendered prompts and token ids serve every step (`_builder`)
        self._builders: dict[tuple[int, int], PromptBuilder] = {}

    @property
    def written_format(self) -> str:
        """How the model writes a move after the prompt: `answer_format` without the
        `PromptConfig.answer_prefix` the prompt already ends with (what the exact
        evaluations score; the constructor checked that the format starts so)."""
        return self.answer_format[len(self.prompt.answer_prefix):]

    def _builder(self, p: ModelPlayer) -> PromptBuilder:
        """The prompt builder of ``p``'s tokenizer and prompt config, one per pair (the
        objects themselves, so an id reused by a new tokenizer gets a new builder); at most
        `_BUILDERS` are kept (a league's snapshots each bring a tokenizer)."""
        tok, cfg = p.policy.tokenizer, p.prompt or self.prompt
        key = (id(tok), id(cfg))
        builder = self._builders.get(key)
        if builder is None or builder.tok is not tok or builder.cfg is not cfg:
            if len(self._builders) >= _BUILDERS:
                self._builders.clear()
            builder = self._builders[key] = PromptBuilder(tok, cfg)
        return builder

    def run_episodes(self, env: str | Callable[[], Env], env_options: dict[str, Any] | None = None,
             seeds: Sequence[int] = (0,), group_size: int = 1, seat_players: SeatPlayers = None,
             group_offset: int = 0, players_fn: Callable[[int], SeatPlayers] | None = None,
             sample_seeds: Sequence[int] | None = None) -> list[Episode]:
        """Play ``len(seeds) * group_size`` episodes to the end; see the module docstring."""
        if group_size < 1:
            raise ValueError(f"group_size={group_size}; must be >= 1")
        if (seat_players is None) == (players_fn is None):
            raise ValueError("play: give exactly one of seat_players (a policy for self-play, or "
                             "one player per seat) and players_fn (episode index -> players)")
        if sample_seeds is not None and len(sample_seeds) != len(seeds):
            raise ValueError(f"play: {len(sample_seeds)} sample_seeds for {len(seeds)} seeds")
        slots = []
        for j, seed in enumerate(seeds):
            for m in range(group_size):
                sp = players_fn(len(slots)) if players_fn is not None else seat_players
                slots.append(self._start(env, env_options or {}, int(seed), group_offset + j, sp))
                if sample_seeds is not None:
                    slots[-1].sample_seed = stable_seed(sample_seeds[j], m)
                slots[-1].explore_seed = stable_seed("explore", sample_seeds[j] if sample_seeds
                                              is not None else (int(seed), group_offset + j), m)
        active = [s for s in slots if not s.done]
        while active:
            calls: dict[tuple[int, SamplingParams], list[_Slot]] = {}
            for s in active:
                seat = s.env.current_seat()
                player = s.players[seat]
                if isinstance(player, BotPlayer):
                    self._apply(s, seat, player.fn(s.env, seat), None, None)
                    continue
                user = s.feedback + s.env.observation(seat)
                legal = self._constraint(s.env, seat)
                drawn = None  # an explored move's command word: the sampler writes the rest
                rng = self._explores(s, seat, player) if player.explore else None
                if rng is not None:
                    if not isinstance(legal, ActionPrefixes):
                        self._explore(s, seat, player, user, rng)
                        continue
                    drawn = ActionPrefixes([rng.choice(legal)]) if len(legal) > 1 else None
                sp = player.sampling or self.sampling
                rendered = self._builder(player).build(s.env.system_prompt(seat), s.hist[seat], user)
                s.req = dict(seat=seat, user=user, rendered=rendered, legal=drawn or legal,
                             explored=legal if drawn else None)
                calls.setdefault((id(player.policy), sp), []).append(s)
            for (_, sp), group in calls.items():
                policy = group[0].players[group[0].req["seat"]].policy
                allowed = [s.req["legal"] for s in group]
                kw: dict[str, Any] = {}
                if sample_seeds is not None and _takes_seeds(policy):
                    kw["seeds"] = [stable_seed(s.sample_seed, len(s.ep.turns)) for s in group]
                gens = policy.generate([s.req["rendered"].ids for s in group], sp,
                                       allowed=allowed if any(a is not None for a in allowed) else None,
                                       **kw)
                answer = self._builder(group[0].players[group[0].req["seat"]]).cfg.answer
                for s, gen in zip(group, gens):
                    seat, prefixes = s.req["seat"], s.req["explored"]
                    if prefixes is not None:
                        gen = _explored_generation(gen, prefixes, policy)
                    self._apply(s, seat, answer(gen.text), gen, s.req["rendered"])
                    if prefixes is not None and s.players[seat].train:
                        s.ep.turns[s.last[seat]].extras["explored"] = 1.0
            active = [s for s in active if not s.done]
        return [s.ep for s in slots]

    def _explores(self, s: _Slot, seat: int, player: ModelPlayer) -> random.Random | None:
        """The turn's exploration draw: with probability ``player.explore`` (never after the
        player's first ``player.explore_turns`` turns of the episode, if > 0) the random
        stream the explored move is drawn from, else None."""
        own_turns = sum(t.agent == seat for t in s.ep.turns)
        if player.explore_turns and own_turns >= player.explore_turns:
            return None
        rng = random.Random(stable_seed(s.explore_seed, len(s.ep.turns)))
        return rng if rng.random() < player.explore else None

    def _explore(self, s: _Slot, seat: int, player: ModelPlayer, user: str,
                 rng: random.Random) -> None:
        """Play a uniformly random legal action drawn from ``rng`` for ``seat`` (recorded in
        the seat's history as if sampled)."""
        legal = s.env.legal_actions(seat)
        if not legal:
            raise ValueError(f"player {player.name!r} explores (explore={player.explore}), but "
                             f"{s.env.name!r} lists no legal actions to draw from (nor, under "
                             "constrained decoding, action prefixes)")
        moves = tactical_actions(s.env, seat, legal) if player.explore_tactical else legal
        move = rng.choice(moves)
        builder = self._builder(player)
        if not player.train:
            self._apply(s, seat, move, None, None)
            s.hist[seat].append(Exchange(user, builder._encode(move), move))
            return True
        # a training player's explored move is a row of the batch: the move written as the
        # model writes it, with the token ids (and constrained-decoding restrictions) a
        # sample of that answer would carry, and no sampler log-probs (the learner's own)
        constrained = self.invalid.mode == "constrained"  # the sampler writes the bare move
        written = move if constrained else self.written_format.format(move)
        encode = player.policy.tokenizer.encode
        ids = list(encode(written, add_special_tokens=False))
        eos = player.policy.eos_ids[0]
        allowed_ids = None
        if constrained:  # the trie the sampler restricts to (`HFPolicy.encode_actions`)
            ids.append(eos)
            trie = TokenTrie([list(encode(a, add_special_tokens=False)) + [eos] for a in legal])
            allowed_ids = trie.allowed_along(ids)
        elif not any(written.endswith(stop) for stop in (player.sampling or self.sampling).stop):
            ids.append(eos)  # the answer ends where the model's would: its stop string or EOS
        rendered = builder.build(s.env.system_prompt(seat), s.hist[seat], user)
        s.req = dict(seat=seat, user=user, rendered=rendered, legal=None)
        gen = Generation(token_ids=ids, logprobs=None, text=written, finish_reason="explore",
                         allowed_ids=allowed_ids)
        self._apply(s, seat, builder.cfg.answer(written), gen, rendered)
        s.ep.turns[s.last[seat]].extras["explored"] = 1.0

    def _constraint(self, env: Env, seat: int) -> list[str] | ActionPrefixes | None:
        """What the sampler restricts ``seat``'s move to under constrained decoding: the
        env's legal actions, else its action prefixes (free text after one of them), else
        nothing."""
        if self.invalid.mode != "constrained":
            return None
        legal = env.legal_actions(seat)
        if legal is not None:
            return legal
        prefixes = action_prefixes(env, seat)
        return ActionPrefixes(prefixes) if prefixes else None

    def _start(self, env: str | Callable[[], Env], options: dict[str, Any], seed: int, group: int,
               sp: SeatPlayers) -> _Slot:
        if isinstance(env, str):
            from sparring.envs import make

            e = make(env, **options)
        else:
            e = env(**options)
        e.reset(seed)
        n = e.num_seats
        players = [as_player(p) for p in sp] if isinstance(sp, list | tuple) else [as_player(sp)] * n
        if len(players) != n:
            raise ValueError(f"{len(players)} players for {n} seats of {e.name!r}")
        ep = Episode(env=e.name, seed=seed, group=group, num_agents=n,
                     info={"players": [p.name for p in players]})
        s = _Slot(env=e, ep=ep, players=players, hist=[[] for _ in range(n)], last=[None] * n,
                  pending=[0.0] * n, totals=[0.0] * n)
        if e.current_seat() is None:
            self._finish(s)
        return s

    def _credit(self, s: _Slot, rewards: Sequence[float], actor: int, turn: Turn) -> None:
        for seat, r in enumerate(rewards):
            r = float(r)
            s.totals[seat] += r
            if seat == actor:
                turn.reward += r
            elif s.last[seat] is not None:
                s.ep.turns[s.last[seat]].reward += r
            else:
                s.pending[seat] += r

    def _apply(self, s: _Slot, seat: int, text: str, gen: Generation | None,
               rendered: Rendered | None) -> None:
        env, ep = s.env, s.ep
        player = s.players[seat]
        record = isinstance(player, ModelPlayer) and player.train and gen is not None
        turn = Turn(agent=seat, prompt_ids=list(rendered.ids) if record else [],
                    action_ids=list(gen.token_ids) if record else [],
                    logprobs=list(gen.logprobs) if record and gen.logprobs is not None else None,
                    entropies=gen.entropies if record else None,
                    allowed_ids=gen.allowed_ids if record else None,
                    state_key=env.state_key(), prompt_text=rendered.text if rendered else "",
                    action_text=text, reward=s.pending[seat])
        s.pending[seat] = 0.0
        if rendered is not None and rendered.truncated:
            turn.extras["prompt_truncated"] = 1.0
        ep.turns.append(turn)
        s.last[seat] = len(ep.turns) - 1
        if gen is not None:
            s.hist[seat].append(Exchange(s.req["user"], list(gen.token_ids), gen.text))
        parsed = env.parse(seat, text)
        if self.strict_format and gen is not None:
            parsed = self._strict(parsed, text)
        if parsed.ok:
            res = env.step(parsed.action)
            self._credit(s, res.rewards, seat, turn)
            s.retries, s.feedback = 0, ""
            over = res.done or env.current_seat() is None
            if res.done and res.info:
                ep.info["outcome"] = dict(res.info)
        else:
            if isinstance(player, BotPlayer):
                raise RuntimeError(f"bot {player.name!r} played {text!r} in {ep.env!r}: "
                                   f"{parsed.status} ({parsed.error})")
            turn.invalid = parsed.status
            turn.reward += self.invalid.penalty
            s.totals[seat] += self.invalid.penalty
            ep.info["invalid_turns"] = ep.info.get("invalid_turns", 0) + 1
            if self.invalid.mode == "retry" and s.retries < self.invalid.max_retries:
                s.retries += 1
                s.feedback = retry_feedback(parsed.error) + "\n\n"
                over = False
            else:
                ep.info["forfeit"] = seat
                over = True
        if over:
            turn.done = True
            self._finish(s)
        elif len(ep.turns) >= self.max_turns:
            ep.truncated = True
            self._finish(s)

    def _strict(self, parsed: ParseResult, text: str) -> ParseResult:
        """``parsed`` when ``text`` is exactly the answer format around the move the env
        read from it (letter case aside), else an "unparsable" result saying the format."""
        move = strict_answer(text, self.answer_format)
        if move is not None and (not parsed.ok or move.lower() == str(parsed.action).lower()):
            return parsed  # well-formed: legal, or the env's own verdict on the move
        return ParseResult("unparsable", error="answer with exactly one move, written "
                           f"{self.answer_format.format('MOVE')}")

    def _finish(self, s: _Slot) -> None:
        s.done = True
        s.ep.returns = list(s.totals)
        s.ep.info["env_returns"] = [float(x) for x in s.env.returns()]
        if hasattr(s.env, "start_record"):  # a training start (RandomOpening): replayable
            s.ep.info["start"] = s.env.start_record()


def _explored_generation(gen: Generation, prefixes: ActionPrefixes, policy: Any) -> Generation:
    """A generation sampled with its command word drawn at random from ``prefixes``, as a
    row for the learner: the allowed ids those of all the prefixes (where the word was
    drawn, the learner weighs the choice among them), and no sampler log-probs (the
    learner's own; `sparring.rollout.players`). The prefixes' trie is the one the sampler
    restricts to (the policy's cached ``encode_actions``)."""
    allowed = policy.encode_actions(prefixes).allowed_along(gen.token_ids)
    return Generation(token_ids=gen.token_ids, logprobs=None, text=gen.text,
                      finish_reason="explore", allowed_ids=allowed)


def _takes_seeds(policy: Any) -> bool:
    """Whether ``policy.generate`` takes per-prompt ``seeds`` (`HFPolicy` does). Read from
    the instance's own ``generate`` every time, not cached per class: an instance whose
    ``generate`` is wrapped must not decide for every other one (a class-wide cache did,
    and a wrapped policy in one test turned off per-prompt seeds for the rest of the
    process)."""
    try:
        return "seeds" in inspect.signature(policy.generate).parameters
    except (TypeError, ValueError):
        return False
