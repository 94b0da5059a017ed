"""The arena on a scripted race game: seats, groups, reward crediting, masks, invalid paths."""

import pytest
import torch

from sparring.data import collate
from sparring.envs import make
from sparring.envs.base import ParseResult, StepResult
from sparring.envs.invalid import InvalidActionPolicy, retry_feedback
from sparring.envs.parsing import parse_choice
from sparring.policy.forward import token_logprobs
from sparring.policy.hf import HFPolicy
from sparring.policy.sampling import Generation, SamplingParams
from sparring.policy.tiny import build_tiny_model
from sparring.rollout.arena import Arena
from sparring.rollout.players import BotPlayer, ModelPlayer
from sparring.rollout.prompts import PromptConfig


class Race:
    """Seats in turn add 1 or 2 to a total; reaching ``target`` wins (+1, others -1/(n-1)).
    Saying "2" earns the actor 0.1 at once; with ``welcome`` the last seat gets 0.5 at the
    first step (before it has acted). "3" is a known but never legal move."""

    name = "race"

    def __init__(self, seats: int = 2, target: int = 5, welcome: bool = False):
        self.num_seats, self.target, self.welcome = seats, target, welcome

    def reset(self, seed):
        self.total, self.seat, self.over, self.steps = seed % 2, 0, False, 0
        self.ret = [0.0] * self.num_seats

    def current_seat(self):
        return None if self.over else self.seat

    def system_prompt(self, seat):
        return f"seat {seat}: say 1 or 2"

    def observation(self, seat):
        return f"total={self.total}"

    def legal_actions(self, seat):
        return ["1", "2"] if self.total <= self.target - 2 else ["1"]

    def parse(self, seat, text) -> ParseResult:
        return parse_choice(text, self.legal_actions(seat), all_actions=["1", "2", "3"])

    def step(self, action):
        n, a = self.num_seats, self.seat
        r = [0.0] * n
        r[a] += 0.1 if action == "2" else 0.0
        if self.welcome and self.steps == 0:
            r[n - 1] += 0.5
        self.total += int(action)
        self.steps += 1
        if self.total >= self.target:
            self.over = True
            for s in range(n):
                r[s] += 1.0 if s == a else -1.0 / (n - 1)
        else:
            self.seat = (a + 1) % n
        self.ret = [x + y for x, y in zip(self.ret, r)]
        return StepResult(rewards=r, done=self.over)

    def state_key(self):
        return f"{self.total}:{self.seat}"

    def returns(self):
        return list(self.ret)


class Stub:
    """A policy returning scripted strings: ``script(call, row, allowed) -> text``."""

    def __init__(self, tok, script, name="stub"):
        self.tokenizer, self.script, self.name, self.calls = tok, script, name, []

    def generate(self, prompts, sampling=None, allowed=None):
        self.calls.append({"prompts": [list(p) for p in prompts], "allowed": allowed})
        out = []
        for i, _ in enumerate(prompts):
            text = self.script(len(self.calls) - 1, i, None if allowed is None else allowed[i])
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            out.append(Generation(token_ids=ids, logprobs=[-0.5] * len(ids), text=text,
                                  finish_reason="eos"))
        return out


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model({"seed": 2})


def reference_rewards(seats, seed, actions, welcome=False, target=5):
    """Brute-force replay of the race rules with the documented crediting rule."""
    total, turn_rewards, last, pending, totals = seed % 2, [], {}, [0.0] * seats, [0.0] * seats
    for k, a in enumerate(actions):
        actor = k % seats
        turn_rewards.append(pending[actor])
        pending[actor] = 0.0
        last[actor] = k
        step = [0.0] * seats
        step[actor] += 0.1 if a == "2" else 0.0
        if welcome and k == 0:
            step[seats - 1] += 0.5
        total += int(a)
        if total >= target:
            for s in range(seats):
                step[s] += 1.0 if s == actor else -1.0 / (seats - 1)
        for s in range(seats):
            totals[s] += step[s]
            if s == actor:
                turn_rewards[k] += step[s]
            elif s in last:
                turn_rewards[last[s]] += step[s]
            else:
                pending[s] += step[s]
    return turn_rewards, totals


@pytest.mark.parametrize("seats", [2, 3])
def test_self_play_constrained_tiny_model(tiny, seats):
    model, tok = tiny
    pol = HFPolicy(model, tok, seed=0)
    arena = Arena(SamplingParams(max_new_tokens=4, temperature=1.3), PromptConfig("full"),
                  InvalidActionPolicy("constrained"))
    eps = arena.run_episodes(lambda: Race(seats, welcome=True), seeds=[4, 7], group_size=3, seat_players=pol)
    assert [e.group for e in eps] == [0, 0, 0, 1, 1, 1] and [e.seed for e in eps] == [4, 4, 4, 7, 7, 7]
    for ep in eps:
        assert ep.info["players"] == ["policy"] * seats and "forfeit" not in ep.info
        assert [t.agent for t in ep.turns] == [k % seats for k in range(len(ep.turns))]
        actions = [t.action_text for t in ep.turns]
        assert all(a in ("1", "2") for a in actions)
        ref_turn, ref_tot = reference_rewards(seats, ep.seed, actions, welcome=True)
        assert [t.reward for t in ep.turns] == pytest.approx(ref_turn)
        assert ep.returns == pytest.approx(ref_tot) == ep.info["env_returns"]
        assert [t.done for t in ep.turns] == [False] * (len(ep.turns) - 1) + [True]
        assert ep.turns[0].state_key == f"{ep.seed % 2}:0"
    assert len({tuple(t.action_text for t in e.turns) for e in eps}) > 1  # sampling varies
    # masks: exactly the sampled tokens, in both layouts; log-probs reproduce (restricted)
    for layout in ("turn", "trajectory"):
        b = collate(eps, layout=layout)
        for i in range(b.n_rows):
            ep = eps[int(b.episode[i])]
            mine = [t for t in ep.turns if t.agent == int(b.agent[i])]
            if layout == "turn":
                mine = [mine[int(b.turn[i])]]
            assert b.input_ids[i][b.action_mask[i]].tolist() == [x for t in mine for x in t.action_ids]
            assert b.old_logp[i][b.action_mask[i]].tolist() == pytest.approx(
                [x for t in mine for x in t.logprobs])
            if layout == "trajectory":  # the whole row is what the model saw, in order
                last = mine[-1]
                assert b.input_ids[i, :int(b.attention_mask[i].sum())].tolist() == \
                    last.prompt_ids + last.action_ids
        lp, _ = token_logprobs(model, b.input_ids, b.attention_mask, temperature=1.3, allowed=b.allowed)
        torch.testing.assert_close(lp[b.action_mask], b.old_logp[b.action_mask], atol=1e-5, rtol=0)


def test_bot_seat_and_frozen_opponent(tiny):
    model, tok = tiny
    pol = HFPolicy(model, tok, seed=1)
    bot = BotPlayer(lambda env, seat: "1", name="ones")
    frozen = ModelPlayer(HFPolicy(model, tok, seed=9), name="frozen", train=False)
    arena = Arena(SamplingParams(max_new_tokens=4), invalid=InvalidActionPolicy("constrained"))
    eps = arena.run_episodes(lambda: Race(3), seeds=[0], group_size=2, seat_players=[pol, bot, frozen])
    for ep in eps:
        assert ep.info["players"] == ["policy", "ones", "frozen"]
        for t in ep.turns:
            assert bool(t.action_ids) == (t.agent == 0)
            if t.agent == 1:
                assert t.action_text == "1"
        b = collate([ep])
        assert set(b.agent.tolist()) == {0}
        assert b.n_rows == len(ep.agent_turns(0))


def test_players_fn_chooses_per_episode(tiny):
    model, tok = tiny
    ones = BotPlayer(lambda env, seat: "1", name="ones")
    twos = BotPlayer(lambda env, seat: "2" if "2" in env.legal_actions(seat) else "1", name="twos")
    eps = Arena().run_episodes(lambda: Race(2), seeds=[0, 0], players_fn=lambda i: [ones, twos] if i % 2 else [twos, ones])
    assert [e.info["players"] for e in eps] == [["twos", "ones"], ["ones", "twos"]]
    # seed 0: total 0. twos, ones: 2,1,2 -> seat 0 wins; ones, twos: 1,2,1,1 -> seat 1 wins
    assert [t.action_text for t in eps[0].turns] == ["2", "1", "2"] and eps[0].returns == pytest.approx([1.2, -1.0])
    assert [t.action_text for t in eps[1].turns] == ["1", "2", "1", "1"]
    assert eps[1].returns == pytest.approx([-1.0, 1.1])


def test_the_arena_keeps_one_prompt_builder_per_tokenizer_and_config_across_runs(
        tiny, monkeypatch):
    """Prompt renders are memoised per builder; a builder serves every run of its
    tokenizer and prompt config, and another tokenizer object gets one of its own."""
    import copy

    import sparring.rollout.arena as arena_module
    model, tok = tiny
    made = []
    real = arena_module.PromptBuilder
    monkeypatch.setattr(arena_module, "PromptBuilder",
                        lambda t, c: made.append((t, c)) or real(t, c))
    arena = Arena(SamplingParams(max_new_tokens=4), invalid=InvalidActionPolicy("constrained"))
    pol = HFPolicy(model, tok, seed=0)
    for seed in (0, 1):
        arena.run_episodes(lambda: Race(2), seeds=[seed], group_size=2, seat_players=pol)
    assert [t for t, _ in made] == [tok]
    other = HFPolicy(model, copy.deepcopy(tok), seed=0)
    arena.run_episodes(lambda: Race(2), seeds=[0], seat_players=[pol, other])
    assert [t for t, _ in made] == [tok, other.tokenizer]
    mine = PromptConfig("full")
    arena.run_episodes(lambda: Race(2), seeds=[0],
                       seat_players=[pol, ModelPlayer(pol, name="own", prompt=mine)])
    assert made[-1] == (tok, mine) and len(made) == 3


def test_forfeit_on_unparsable_and_illegal(tiny):
    _, tok = tiny
    for text, status in (("banana", "unparsable"), ("I say 3", "illegal")):
        stub = Stub(tok, lambda c, i, a, text=text: text)
        eps = Arena(invalid=InvalidActionPolicy("forfeit", penalty=-2.0)).run_episodes(
            lambda: Race(2), seeds=[0, 1], seat_players=stub)
        for ep in eps:
            assert len(ep.turns) == 1 and ep.turns[0].invalid == status and ep.turns[0].done
            assert ep.turns[0].reward == -2.0 and ep.returns == [-2.0, 0.0]
            assert ep.info["forfeit"] == 0 and ep.info["env_returns"] == [0.0, 0.0]
        assert len(stub.calls) == 1 and len(stub.calls[0]["prompts"]) == 2  # one batched call


def test_retry_shows_error_then_forfeits_after_max_retries(tiny):
    _, tok = tiny
    # episode 0: invalid, then "2", then valid moves; episode 1: always invalid
    def script(call, row, allowed):
        if row == 1 and call < 3:
            return "banana"
        return "banana" if call == 0 else "2"
    stub = Stub(tok, script)
    eps = Arena(invalid=InvalidActionPolicy("retry", penalty=-0.5, max_retries=2)).run_episodes(
        lambda: Race(2, target=4), seeds=[0, 0], seat_players=stub)
    a, b = eps
    assert [t.agent for t in a.turns][:2] == [0, 0] and a.turns[0].invalid == "unparsable"
    assert a.turns[1].invalid is None
    err = parse_choice("banana", ["1", "2"], ["1", "2", "3"]).error
    assert retry_feedback(err) in a.turns[1].prompt_text and retry_feedback(err) not in a.turns[0].prompt_text
    # retried prompt extends the first: the invalid action is in the seat's history
    assert a.turns[1].prompt_ids[:len(a.turns[0].prompt_ids) + len(a.turns[0].action_ids)] == \
        a.turns[0].prompt_ids + a.turns[0].action_ids
    # a: seat0 bad(-0.5) then 2(+0.1), seat1 2(+0.1) -> total 4, seat1 wins
    assert [t.action_text for t in a.turns] == ["banana", "2", "2"]
    assert a.returns == pytest.approx([-0.4 - 1.0, 1.1])
    assert [t.invalid for t in b.turns] == ["unparsable"] * 3 and b.info["forfeit"] == 0
    assert b.returns == pytest.approx([-1.5, 0.0]) and b.turns[-1].done


def test_constrained_mode_passes_legal_actions_and_forfeits_on_bug(tiny):
    _, tok = tiny
    stub = Stub(tok, lambda c, i, a: a[-1])
    eps = Arena(invalid=InvalidActionPolicy("constrained")).run_episodes(lambda: Race(2), seeds=[0], seat_players=stub)
    # total 0 -2-> 2 -2-> 4 (only "1" legal) -1-> 5
    assert [c["allowed"] for c in stub.calls] == [[["1", "2"]], [["1", "2"]], [["1"]]]
    assert [t.action_text for t in eps[0].turns] == ["2", "2", "1"]
    bad = Stub(tok, lambda c, i, a: "3")
    ep = Arena(invalid=InvalidActionPolicy("constrained")).run_episodes(lambda: Race(2), seat_players=bad)[0]
    assert ep.info["forfeit"] == 0 and ep.turns[0].invalid == "illegal"


def test_a_free_text_env_with_action_prefixes_gets_them_spelt_and_the_rest_sampled(tiny):
    """The calculator under constrained decoding: every turn of the tiny model begins with
    a command word the env offered (only `answer:` once its one call is spent), the tokens
    after it are free (None in the turn's allowed ids), and the episode ends in an answer
    or a forfeit on an unreadable rest."""
    model, tok = tiny
    policy = HFPolicy(model, tok, seed=0)
    arena = Arena(SamplingParams(max_new_tokens=8), invalid=InvalidActionPolicy("constrained"))
    eps = arena.run_episodes(lambda: make("calculator", max_calls=1), seeds=range(12),
                             seat_players=policy)
    for ep in eps:
        for k, t in enumerate(ep.turns):
            offered = ("calc:", "answer:") if k == 0 else ("answer:",)
            assert t.action_text.startswith(offered), t.action_text
            word = next(w for w in offered if t.action_text.startswith(w))
            n = len(tok.encode(word, add_special_tokens=False))
            assert all(a is not None for a in t.allowed_ids[:n])
            assert t.allowed_ids[n:] == [None] * (len(t.action_ids) - n)
        assert ep.turns[-1].done
    assert {t.action_text.split(":")[0] for ep in eps for t in ep.turns} == {"calc", "answer"}


def test_turn_budget_and_prompt_truncation(tiny):
    model, tok = tiny
    stub = Stub(tok, lambda c, i, a: "1")
    ep = Arena(prompt=PromptConfig(max_prompt_tokens=30), max_turns=3).run_episodes(
        lambda: Race(2, target=50), seat_players=stub)[0]
    assert ep.truncated and len(ep.turns) == 3 and not any(t.done for t in ep.turns)
    # seat 0's first prompt: system 18 chars + 2 markers, "total=0" + 2, generation prompt 1
    assert len(ep.turns[0].prompt_ids) == 30 and "prompt_truncated" not in ep.turns[0].extras
    assert ep.turns[2].extras["prompt_truncated"] == 1.0 and len(ep.turns[2].prompt_ids) <= 30


def test_bad_arguments(tiny):
    _, tok = tiny
    stub = Stub(tok, lambda c, i, a: "1")
    with pytest.raises(ValueError, match="exactly one"):
        Arena().run_episodes(lambda: Race(2))
    with pytest.raises(ValueError, match="3 players for 2 seats"):
        Arena().run_episodes(lambda: Race(2), seat_players=[stub, stub, stub])
    with pytest.raises(RuntimeError, match="bot 'bad'"):
        Arena().run_episodes(lambda: Race(2), seat_players=BotPlayer(lambda e, s: "9", name="bad"))


@pytest.mark.parametrize("epsilon", [0.0, 0.5, 1.0])
def test_an_exploring_frozen_player_plays_uniform_legal_moves_with_probability_epsilon(tiny, epsilon):
    """The stub always says "1"; with probability epsilon a turn is a uniform draw from the
    legal moves instead, so where both "1" and "2" are legal, "2" has frequency epsilon / 2,
    and the stub is asked only for the other turns."""
    _, tok = tiny
    stub = Stub(tok, lambda c, i, a: "1")
    explorer = ModelPlayer(stub, name="explorer", train=False, explore=epsilon)
    ones = BotPlayer(lambda env, seat: "1", name="ones")
    arena = Arena(SamplingParams(max_new_tokens=4), PromptConfig("full"),
                  InvalidActionPolicy("constrained"))
    race = lambda: Race(2, target=30)  # noqa: E731
    eps = arena.run_episodes(race, seeds=list(range(40)), group_size=5, seat_players=[explorer, ones])
    mine = [t for e in eps for t in e.turns if t.agent == 0]
    both_legal = [t for t in mine if int(t.state_key.split(":")[0]) <= 28]
    twos = sum(t.action_text == "2" for t in both_legal) / len(both_legal)
    n = len(both_legal)
    assert n > 1000 and abs(twos - epsilon / 2) < 4 * (0.25 / n) ** 0.5 + 1e-9
    asked = sum(len(call["prompts"]) for call in stub.calls)
    explored = len(mine) - asked
    assert abs(explored / len(mine) - epsilon) < 4 * (0.25 / len(mine)) ** 0.5 + 1e-9
    assert all(not t.action_ids for t in mine)  # frozen: no training rows either way
    if 0 < epsilon < 1:  # an explored move is in the explorer's own history, as if sampled
        prompts = [tok.decode(p) for call in stub.calls for p in call["prompts"]]
        assert any(">2<" in p for p in prompts)
    again = arena.run_episodes(race, seeds=list(range(40)), group_size=5, seat_players=[explorer, ones])
    assert [[t.action_text for t in e.turns] for e in again] == \
        [[t.action_text for t in e.turns] for e in eps]  # seeded per episode and turn


def test_explore_turns_limits_exploration_to_a_players_first_turns(tiny):
    """explore=1 with explore_turns=2: the explorer's first two moves of each episode are
    uniform legal draws (half of them "2" where both moves are legal), every later move is
    the stub's "1", and the stub is asked only for those later moves."""
    _, tok = tiny
    stub = Stub(tok, lambda c, i, a: "1")
    explorer = ModelPlayer(stub, name="explorer", train=False, explore=1.0, explore_turns=2)
    ones = BotPlayer(lambda env, seat: "1", name="ones")
    arena = Arena(SamplingParams(max_new_tokens=4), PromptConfig("full"),
                  InvalidActionPolicy("constrained"))
    eps = arena.run_episodes(lambda: Race(2, target=30), seeds=list(range(100)), group_size=2,
                     seat_players=[explorer, ones])
    mine = [[t for t in e.turns if t.agent == 0] for e in eps]
    first = [t.action_text for turns in mine for t in turns[:2]]
    assert len(first) == 400 and abs(first.count("2") / 400 - 0.5) < 4 * (0.25 / 400) ** 0.5
    assert all(t.action_text == "1" for turns in mine for t in turns[2:])
    asked = sum(len(call["prompts"]) for call in stub.calls)
    assert asked == sum(len(turns) - 2 for turns in mine) > 0


def test_a_tactical_explorer_draws_only_among_the_moves_the_lookahead_keeps(tiny):
    """Tic-tac-toe from X 1, O 5, X 2: O must block at 3. An explorer with explore=1 draws
    its first move uniformly from the 6 empty cells (1/6 of them "3"); with
    explore_tactical every first move is the block."""
    from sparring.envs import make

    def threatened():
        env = make("tictactoe", compact=True)
        reset = env.reset

        def reset_to_threat(seed):
            reset(seed)
            for m in ("1", "5", "2"):
                env.step(m)
        env.reset = reset_to_threat
        return env

    _, tok = tiny
    stub = Stub(tok, lambda c, i, a: a[0])
    firsts = {}
    for tactical in (False, True):
        explorer = ModelPlayer(stub, name="explorer", train=False, explore=1.0,
                               explore_tactical=tactical)
        rand = BotPlayer(lambda env, seat: env.legal_actions(seat)[-1], name="last")
        eps = Arena().run_episodes(threatened, seeds=list(range(120)), seat_players=[rand, explorer])
        firsts[tactical] = [next(t.action_text for t in e.turns if t.agent == 1) for e in eps]
    assert firsts[True] == ["3"] * 120
    share = firsts[False].count("3") / 120
    assert abs(share - 1 / 6) < 4 * ((1 / 6) * (5 / 6) / 120) ** 0.5


def test_a_training_players_explored_moves_are_rows_as_its_samples_would_be(tiny):
    """explore=0.5 for a training player under constrained decoding: about half its turns
    are uniform legal draws, and each is a training row whose tokens and per-token allowed
    ids are those the constrained sampler records when it samples the same move at the
    same kind of position (the other half of the turns), with no sampler log-probs and
    ``extras["explored"] = 1``; the episode plays on as if sampled."""
    model, tok = tiny
    player = ModelPlayer(HFPolicy(model, tok, seed=3), name="learner", train=True, explore=0.5)
    arena = Arena(SamplingParams(max_new_tokens=4), PromptConfig("state"),
                  InvalidActionPolicy("constrained"))
    eps = arena.run_episodes(lambda: Race(2, target=12), seeds=list(range(12)), group_size=2,
                     seat_players=player)
    turns = [t for e in eps for t in e.turns]
    explored = [t for t in turns if t.extras.get("explored") == 1.0]
    sampled = [t for t in turns if "explored" not in t.extras]
    assert abs(len(explored) / len(turns) - 0.5) < 4 * (0.25 / len(turns)) ** 0.5
    assert all(t.logprobs is None and t.invalid is None and t.prompt_ids for t in explored)
    assert all(t.logprobs is not None for t in sampled)
    seen = {(t.action_text, tuple(map(tuple, t.allowed_ids))): t.action_ids for t in sampled}
    for t in explored:
        key = (t.action_text, tuple(map(tuple, t.allowed_ids)))
        assert key in seen and seen[key] == t.action_ids
    batch = collate(eps)
    assert batch.input_ids.shape[0] == len(turns)  # every turn is a row
    assert int((batch.extras["explored"] == 1.0).sum()) == len(explored)


def test_an_explored_free_text_move_draws_its_command_word_and_the_learner_weighs_it(tiny):
    """The calculator (two calls) under constrained decoding, explore=1 for a training
    player: where the env offers both command words, each turn's word is drawn uniformly
    and the model writes the rest; the row allows both words at the drawn position (the
    learner's log-prob there is ``z_w - logsumexp(z_calc, z_answer)`` of the first
    tokens), has no sampler log-probs and is marked explored. Where only `answer:` is
    offered (both calls spent) nothing is drawn: the turn is the sampler's own."""
    model, tok = tiny
    player = ModelPlayer(HFPolicy(model, tok, seed=3), name="learner", train=True, explore=1.0)
    arena = Arena(SamplingParams(max_new_tokens=12), PromptConfig("state"),
                  InvalidActionPolicy("constrained"))
    eps = arena.run_episodes(lambda: make("calculator", max_calls=2), seeds=range(40),
                             seat_players=player)
    first = {w: tok.encode(w, add_special_tokens=False)[0] for w in ("calc:", "answer:")}
    assert first["calc:"] != first["answer:"]
    explored, spent = [], []
    for ep in eps:
        for k, t in enumerate(ep.turns):
            if k == 2:  # both calls made: only `answer:`, sampled as usual
                spent.append(t)
                assert "explored" not in t.extras and t.logprobs is not None
                assert t.allowed_ids[0] == [first["answer:"]]
                continue
            explored.append(t)
            assert t.extras["explored"] == 1.0 and t.logprobs is None
            assert sorted(t.allowed_ids[0]) == sorted(first.values())
            assert t.action_text.startswith(("calc:", "answer:"))
    words = [t.action_text.split(":")[0] for t in explored]
    share = words.count("calc") / len(words)
    assert abs(share - 0.5) < 4 * (0.25 / len(words)) ** 0.5
    assert spent  # some episodes made both calls
    batch = collate(eps)
    lp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, allowed=batch.allowed)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits
    rows = [i for i in range(len(batch.input_ids)) if batch.extras["explored"][i] == 1.0]
    assert len(rows) == len(explored)
    for i in rows:
        t = int(batch.action_mask[i].nonzero()[0])  # the drawn word's first token
        z = logits[i, t - 1, list(first.values())].float()
        want = logits[i, t - 1, batch.input_ids[i, t]].float() - torch.logsumexp(z, 0)
        assert lp[i, t].item() == pytest.approx(want.item(), abs=1e-5)


@pytest.mark.parametrize("stop", [("</a>",), ()])
def test_an_explored_move_is_written_in_the_answer_format(stop):
    """Free decoding with answer_prefix "<a>", answer_format "<a>{}</a>" and strict_format:
    an explored move's tokens are what the model writes after the prefix, "1</a>", ending
    at the stop string, or with EOS when "</a>" is no stop string; the answer is well-formed
    (no invalid turn) and the seat's history shows it."""
    model, tok = build_tiny_model({"seed": 2})
    player = ModelPlayer(HFPolicy(model, tok, seed=3), name="learner", train=True, explore=1.0)
    arena = Arena(SamplingParams(max_new_tokens=6, stop=stop),
                  PromptConfig("full", answer_prefix="<a>"), InvalidActionPolicy("forfeit"),
                  answer_format="<a>{}</a>", strict_format=True)
    (ep,) = arena.run_episodes(lambda: Race(2, target=6), seeds=[0], seat_players=player)
    assert "forfeit" not in ep.info and all(t.invalid is None for t in ep.turns)
    for t in ep.turns:
        move = t.action_text[len("<a>"):-len("</a>")]
        assert t.action_text == f"<a>{move}</a>" and move in ("1", "2")
        ids = tok.encode(f"{move}</a>", add_special_tokens=False)
        assert t.action_ids == ids + ([] if stop else [tok.eos_token_id])
        assert t.allowed_ids is None and t.extras["explored"] == 1.0
    first, second = [t for t in ep.turns if t.agent == 0][:2]  # 3 moves at least to 6
    n = len(first.action_ids)  # full history: its explored answer is in its next prompt
    assert any(second.prompt_ids[i:i + n] == first.action_ids
               for i in range(len(second.prompt_ids)))


def test_exploring_players_are_checked(tiny):
    _, tok = tiny
    stub = Stub(tok, lambda c, i, a: "1")
    with pytest.raises(ValueError, match=r"explore=1.5; must be in \[0, 1\]"):
        ModelPlayer(stub, train=False, explore=1.5)
    with pytest.raises(ValueError, match=r"explore_turns=-1; must be >= 0"):
        ModelPlayer(stub, train=False, explore=0.5, explore_turns=-1)

    class FreeText(Race):
        def legal_actions(self, seat):
            return None

    explorer = ModelPlayer(stub, name="explorer", train=False, explore=1.0)
    with pytest.raises(ValueError, match="'explorer' explores .* lists no legal actions"):
        Arena().run_episodes(lambda: FreeText(2), seeds=[0], seat_players=[explorer, explorer])


def test_stop_strings_from_the_config_end_turns_and_the_learner_scores_exactly_them(tiny):
    """`rollout.stop` reaches the arena's sampling: free-decoded turns end at the first
    stop string (not at max_new_tokens), the turn's action ids are exactly the sampled
    tokens up to it, and the learner's recomputed log-probs are the sampler's."""
    from sparring.config import load_config
    from sparring.rollout.rollouts import make_arena

    model, tok = tiny
    free = load_config(None, ["rollout.invalid_action=forfeit", "rollout.max_new_tokens=12",
                              "rollout.temperature=1.5", "rollout.history=full"])
    stop = " "  # the tiny model's character vocabulary: a space comes up often
    cfg = load_config(None, [f"rollout.stop=['{stop}']", "rollout.invalid_action=forfeit",
                             "rollout.max_new_tokens=12", "rollout.temperature=1.5",
                             "rollout.history=full"])
    arena = make_arena(cfg.rollout)
    assert arena.sampling.stop == (stop,) and make_arena(free.rollout).sampling.stop == ()
    eps = arena.run_episodes(lambda: Race(2, target=9), seeds=list(range(6)), group_size=2,
                     seat_players=HFPolicy(model, tok, seed=1))
    turns = [t for e in eps for t in e.turns]
    stopped = [t for t in turns if stop in tok.decode(t.action_ids)]
    assert stopped, "no turn sampled the stop string: the test would prove nothing"
    for t in stopped:  # the stop string ends the action: nothing generated after it
        text = tok.decode(t.action_ids)
        assert text.index(stop) == len(text) - len(stop) and len(t.action_ids) <= 12
    b = collate(eps, layout="turn")
    assert sorted(b.input_ids[i][b.action_mask[i]].tolist() for i in range(b.n_rows)) == \
        sorted(t.action_ids for t in turns)
    lp, _ = token_logprobs(model, b.input_ids, b.attention_mask, temperature=1.5)
    torch.testing.assert_close(lp[b.action_mask], b.old_logp[b.action_mask], atol=1e-5, rtol=0)


def test_an_answer_prefix_is_given_and_the_env_parses_the_whole_answer():
    """With `answer_prefix` the prompt ends with it, the model's tokens are only what it
    wrote after it, and the env parses prefix + written (a scripted policy writes "2]" or
    "1]" after the prefix "[" and the env only accepts "[n]")."""

    class Bracketed(Race):
        def parse(self, seat, text):
            if not (text.startswith("[") and text.endswith("]")):
                return ParseResult(False, None, "malformed", "write [n]")
            return parse_choice(text[1:-1], self.legal_actions(seat), all_actions=["1", "2", "3"])

    tok = build_tiny_model({"seed": 2})[1]
    stub = Stub(tok, lambda call, row, allowed: "1]")
    arena = Arena(SamplingParams(max_new_tokens=4), PromptConfig("state", answer_prefix="["),
                  InvalidActionPolicy("forfeit"), answer_format="[{}]")
    (ep,) = arena.run_episodes(lambda: Bracketed(2, target=3), seeds=[0], seat_players=stub)
    assert "forfeit" not in ep.info and len(ep.turns) == 3  # 0 -> 1 -> 2 -> 3
    assert [t.action_text for t in ep.turns] == ["[1]"] * 3
    prefix_ids = tok.encode("[", add_special_tokens=False)
    for t in ep.turns:
        assert t.prompt_ids[-len(prefix_ids):] == prefix_ids
        assert t.action_ids == tok.encode("1]", add_special_tokens=False) + [tok.eos_token_id]
    assert arena.written_format.format("2") == "2]"
    with pytest.raises(ValueError, match="answer_prefix='<b>' must start answer_format"):
        Arena(prompt=PromptConfig(answer_prefix="<b>"), answer_format="<a>{}</a>")


def test_strict_format_counts_only_an_answer_that_is_exactly_the_format():
    """strict_format: "<a>1</a>" plays 1; "<a>2 1</a>" (the env would read the last move, 1)
    and "I say <a>1</a>" are invalid and forfeit; without it the env's lenient parser plays
    them. The forfeiting seat's turn is marked unparsable with the format in its error."""
    tok = build_tiny_model({"seed": 2})[1]

    def play(answer, strict):
        stub = Stub(tok, lambda call, row, allowed: answer)
        arena = Arena(SamplingParams(max_new_tokens=8), PromptConfig("state"),
                      InvalidActionPolicy("forfeit"), answer_format="<a>{}</a>",
                      strict_format=strict)
        return arena.run_episodes(lambda: Race(2, target=3), seeds=[0], seat_players=stub)[0]

    ok = play("<a>1</a>", True)
    assert "forfeit" not in ok.info and len(ok.turns) == 3  # 0 -> 1 -> 2 -> 3
    for answer in ("<a>2 1</a>", "I say <a>1</a>"):
        bad = play(answer, True)
        assert bad.info["forfeit"] == 0 and bad.turns[0].invalid == "unparsable"
        assert len(bad.turns) == 1 and bad.returns[0] == -1.0
        lenient = play(answer, False)
        assert "forfeit" not in lenient.info


def test_a_wrapped_generate_decides_seeds_for_its_own_instance_only():
    """Whether per-prompt seeds are passed is read per instance: wrapping one policy's
    ``generate`` (as a test or a user's instrumentation may) does not switch seeds off for
    every other policy of its class, so rollouts still split."""
    from sparring.rollout.arena import _takes_seeds

    class Seeded:
        def generate(self, prompts, sampling, allowed=None, seeds=None):
            return []

    wrapped, plain = Seeded(), Seeded()
    wrapped.generate = lambda prompts, *a, **kw: []  # no `seeds` parameter of its own
    assert _takes_seeds(wrapped) is False
    assert _takes_seeds(plain) is True
