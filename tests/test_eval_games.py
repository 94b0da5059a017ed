"""A model policy against bots and its exact exploitability (sparring.eval.games), and a
training run's periodic evaluation (sparring.eval.periodic)."""

from pathlib import Path

import pytest
import torch

from sparring.assembly.run import build
from sparring.config import ConfigError, load_config
from sparring.envs import make
from sparring.eval.exploitability import exploitability
from sparring.eval.games import (
    action_probabilities,
    evaluate_together,
    policy_exploitability,
    policy_strategy,
)
from sparring.eval.periodic import env_options
from sparring.policy.sampling import SamplingParams

CONFIGS = Path(__file__).parents[1] / "configs"
TINY = ["model.options.hidden_size=32", "model.options.num_layers=1",
        "model.options.intermediate_size=64", "model.options.num_heads=2",
        "model.options.num_kv_heads=2"]


def _cfg(overrides=(), recipe="default"):
    return load_config(CONFIGS / f"{recipe}.yaml", [*TINY, "rollout.episodes_per_step=24",
                                                    "envs.0.group_size=4", *overrides])


def test_action_probabilities_match_the_constrained_sampler(tmp_path):
    policy = build(_cfg(), tmp_path).policy
    env = make("kuhn_poker")
    env.reset(0)
    prompt = policy.tokenizer.encode(env.observation(0), add_special_tokens=False)
    legal = env.legal_actions(0)
    probs = action_probabilities(policy, [prompt], [legal])[0]
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-5)
    gens = policy.generate([prompt] * 4, SamplingParams(max_new_tokens=8), allowed=[legal] * 4)
    for g in gens:  # the generation's own log-probs: an independent code path
        act = g.text.replace(policy.tokenizer.eos_token, "")
        assert probs[act] == pytest.approx(float(torch.tensor(g.logprobs).sum().exp()), rel=1e-4)


def test_action_probabilities_of_prompts_sharing_a_start_equal_plain_forwards(tmp_path):
    """Prompts of different lengths that share a system-prompt-like start, and moves of
    one or several tokens: each probability equals the product of the restricted softmaxes
    of one plain forward of that (prompt, move) alone."""
    from sparring.policy.sampling import TokenTrie

    policy = build(_cfg(), tmp_path).policy
    tok = policy.tokenizer
    shared = "You play a game. Answer with one of the legal moves.\n"
    prompts = [tok.encode(shared + s, add_special_tokens=False)
               for s in ("K -", "a longer position here", "Q b")]
    legal = [["pass", "bet"], ["1", "2", "3", "9"], ["call", "fold", "raise"]]
    got = action_probabilities(policy, prompts, legal)
    for p, acts, row in zip(prompts, legal, got):
        seqs = {a: tok.encode(a, add_special_tokens=False) + [policy.eos_ids[0]] for a in acts}
        trie = TokenTrie(list(seqs.values()))
        want = {}
        for a, seq in seqs.items():
            with torch.no_grad():
                z = policy.model(input_ids=torch.tensor([p + seq])).logits[0].float()
            prob, node = 1.0, 0
            for k, t in enumerate(seq):
                kids = sorted(trie.allowed(node))
                prob *= float(torch.softmax(z[len(p) + k - 1, kids], 0)[kids.index(t)])
                node = trie.step(node, t)
            want[a] = prob
        z = sum(want.values())
        for a in acts:
            assert row[a] == pytest.approx(want[a] / z, rel=1e-4, abs=1e-7)


def test_action_probabilities_in_an_answer_format_are_the_choice_after_its_opening(tmp_path):
    """rollout.answer_format '<answer>{}</answer>': each move is scored as written there;
    the shared '<answer>' and the forced rest are probability 1, so the result is the
    softmax over the moves' first characters right after '<answer>' (a hand computation
    from one plain forward), not the bare-move distribution."""
    policy = build(_cfg(), tmp_path).policy
    tok = policy.tokenizer
    prompt = tok.encode("K -", add_special_tokens=False)
    legal = ["pass", "bet"]
    got = action_probabilities(policy, [prompt], [legal], "<answer>{}</answer>")[0]
    opening = tok.encode("<answer>", add_special_tokens=False)
    with torch.no_grad():
        z = policy.model(input_ids=torch.tensor([prompt + opening])).logits[0, -1].float()
    first = [tok.encode(a, add_special_tokens=False)[0] for a in legal]
    want = torch.softmax(z[first], 0)
    assert got["pass"] == pytest.approx(float(want[0]), rel=1e-4)
    assert got["bet"] == pytest.approx(float(want[1]), rel=1e-4)
    bare = action_probabilities(policy, [prompt], [legal])[0]
    assert abs(bare["pass"] - got["pass"]) > 1e-3  # the format changes what is measured
    with pytest.raises(ConfigError, match="rollout.answer_format: 'x' needs exactly one"):
        _cfg(["rollout.answer_format=x"])


def test_policy_exploitability_of_the_model_equals_the_table_it_implies(tmp_path):
    parts = build(_cfg(), tmp_path)
    arena, policy = parts.rollout_fn.arena, parts.policy
    value = policy_exploitability(arena, policy, "kuhn_poker", {})
    # a policy that ignores its card is exploitable; exploitability is within [0, 2] chips
    assert 0.0 < value < 2.0
    assert value != pytest.approx(exploitability("kuhn_poker", lambda s, a: {x: 1 / len(a) for x in a}))


def test_policy_strategy_is_the_table_the_exploitability_scores(tmp_path, capsys):
    """Kuhn poker has 12 information states (3 cards x 4 histories: P0 to open, P1 after a
    pass or a bet, P0 facing a bet after passing); at each the strategy is a distribution
    over pass and bet, and the exploitability of that table is the policy's. `sparring
    eval --strategy` prints one line per state."""
    from sparring.cli import main

    kuhn = ["envs.0.name=kuhn_poker", "envs.0.options={}", "eval.opponents=[random]",
            "envs.0.starts=[{name: loss_replay}]", "envs.0.opponents=[self]"]
    cfg = _cfg(kuhn)
    parts = build(cfg, tmp_path)
    arena, policy = parts.rollout_fn.arena, parts.policy
    table = policy_strategy(arena, policy, "kuhn_poker", {})
    assert len(table) == 12
    for probs in table.values():
        assert set(probs) == {"pass", "bet"} and sum(probs.values()) == pytest.approx(1.0)
    assert exploitability("kuhn_poker", lambda s, a: table[s]) == pytest.approx(
        policy_exploitability(arena, policy, "kuhn_poker", {}))
    run = tmp_path / "run"
    assert main(["train", *TINY, *kuhn, "rollout.episodes_per_step=8", "train.steps=1",
                 "eval.every=0", f"train.run_dir={run}"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--games", "2", "--strategy"]) == 0
    out = capsys.readouterr().out
    lines = out[out.index("kuhn_poker strategy"):].splitlines()[1:13]
    assert all(" pass " in line and " bet " in line for line in lines)


def test_eval_reports_rates_with_intervals(tmp_path):
    cfg = _cfg(["eval.games=12"])
    out = build(cfg, tmp_path).eval_fn(0, None)
    p = "tictactoe/random/"
    assert out[p + "win"] + out[p + "draw"] + out[p + "loss"] == pytest.approx(1.0)
    assert out[p + "non_loss"] == pytest.approx(out[p + "win"] + out[p + "draw"])
    assert out[p + "non_loss_lo"] <= out[p + "non_loss"] <= out[p + "non_loss_hi"]
    assert out[p + "games"] == 12 and out[p + "invalid_rate"] == 0.0


def test_eval_scores_exploitability_where_the_env_declares_a_tree(tmp_path):
    cfg = _cfg(["eval.games=2", "envs.0.name=leduc_poker", "envs.0.options={compact: true}",
                "league.bots=[random]", "eval.opponents=[random]"])
    out = build(cfg, tmp_path).eval_fn(0, None)
    assert 0.0 < out["leduc/exploitability"] < 14.0  # keys use the canonical name
    assert "leduc/exploitability_average" not in out  # no learner, no magnet
    tic = build(_cfg(["eval.games=2"]), tmp_path / "t").eval_fn(0, None)
    assert not any("exploitability" in k for k in tic)


def test_eval_self_play_lets_the_policy_play_every_seat(tmp_path):
    cfg = _cfg(["eval.games=6", "eval.self_play=true"])
    parts = build(cfg, tmp_path)
    out = parts.eval_fn(0, None)
    sampling = SamplingParams(greedy=True, max_new_tokens=cfg.rollout.max_new_tokens)
    direct = evaluate_together(parts.rollout_fn.arena, [parts.policy, parts.policy], sampling,
                               "tictactoe", {}, 6, seed=cfg.train.seed + 1_000_000)
    assert {k: out[f"tictactoe/joint/{k}"] for k in direct} == direct
    # zero-sum: what one seat wins the other loses (no forfeits with constrained moves)
    assert out["tictactoe/joint/mean_return_seat0"] == -out["tictactoe/joint/mean_return_seat1"]
    assert "tictactoe/random/win" in out
    off = build(_cfg(["eval.games=6"]), tmp_path / "off").eval_fn(0, None)
    assert not any("/joint/" in k for k in off)


def test_env_options_find_a_spec_by_name_or_alias():
    cfg = _cfg(["envs.0.name=tic_tac_toe", "envs.0.options={compact: true}"])
    assert env_options(cfg, "tictactoe") == env_options(cfg, "tic_tac_toe") == {"compact": True}
    assert env_options(cfg, "leduc") == {}


def test_unknown_eval_opponent_is_a_config_error():
    with pytest.raises(ConfigError, match=r"eval.opponents.1: unknown opponent 'bogus'.*"
                                          r"allowed: .*random"):
        _cfg(["eval.opponents=[random,bogus]"])


class Garbage:
    """A model-like policy whose every answer is unparsable."""

    name = "garbage"

    def __init__(self):
        from sparring.policy.tiny import build_tokenizer

        self.tokenizer = build_tokenizer()

    def generate(self, prompts, sampling=None, allowed=None):
        from sparring.policy.sampling import Generation

        ids = self.tokenizer.encode("zz", add_special_tokens=False)
        return [Generation(token_ids=ids, logprobs=[0.0] * len(ids), text="zz",
                           finish_reason="eos") for _ in prompts]


@pytest.mark.parametrize("penalty", [0.0, -1.0])
def test_a_forfeited_game_is_a_loss_whatever_the_penalty(penalty):
    """With invalid_action=forfeit a model that never plays a legal move loses every game,
    whatever the penalty: a game forfeited before any reward has score 0, and it counts
    as a loss, not a draw (non_loss 0)."""
    from sparring.envs.bots import make_bot
    from sparring.envs.invalid import InvalidActionPolicy
    from sparring.eval.games import evaluate_vs_bot
    from sparring.rollout.arena import Arena

    arena = Arena(invalid=InvalidActionPolicy("forfeit", penalty))
    r = evaluate_vs_bot(arena, Garbage(), SamplingParams(), "tictactoe", {},
                        make_bot("random", 0), 6)
    # 6 games, the model forfeits its first move in each: 6 losses, 0 wins, 0 draws
    assert (r["win"], r["draw"], r["loss"], r["non_loss"]) == (0.0, 0.0, 1.0, 0.0)
    assert r["non_loss_seat0"] == r["non_loss_seat1"] == 0.0
    assert r["forfeit_rate"] == 1.0 and r["invalid_rate"] == 1.0
    assert r["mean_return"] == penalty  # the arena's total: no game reward, one penalty
    assert r["loss_lo"] > 0.5  # Wilson(6 of 6) lower bound = 0.6097


def test_outcome_by_hand():
    from sparring.data import Episode
    from sparring.eval.games import outcome

    forfeit = Episode(env="tictactoe", seed=0, group=0, num_agents=2, returns=[0.0, -1.0],
                      info={"forfeit": 1, "env_returns": [0.0, 0.0]})
    assert outcome(forfeit, 1) == (-1, -1.0) and outcome(forfeit, 0) == (1, 0.0)
    played = Episode(env="tictactoe", seed=0, group=0, num_agents=2, returns=[0.5, -1.5],
                     info={"env_returns": [1.0, -1.0]})
    assert outcome(played, 0) == (1, 1.0) and outcome(played, 1) == (-1, -1.0)
    tie = Episode(env="tictactoe", seed=0, group=0, num_agents=2, returns=[0.0, 0.0],
                  info={"env_returns": [0.0, 0.0]})
    assert outcome(tie, 0) == (0, 0.0)


def test_eval_games_below_one_is_an_error():
    from sparring.eval.games import evaluate_vs_bot
    from sparring.rollout.arena import Arena

    with pytest.raises(ValueError, match="games: must be >= 1, got 0"):
        evaluate_vs_bot(Arena(), Garbage(), SamplingParams(), "tictactoe", {}, None, 0)


def test_with_an_answer_prefix_the_exact_evaluation_scores_what_follows_it(tmp_path):
    """rollout.answer_prefix '<answer>' ends every prompt, so the exact evaluations score
    each move as the model writes it after the prefix ("bet</answer>"): the softmax over
    the moves' first characters after the prompt plus '<answer>' (one plain forward, by
    hand). A prefix that does not start the format is refused by name."""
    from sparring.eval.games import probabilities_at
    from sparring.rollout.prompts import PromptBuilder, PromptConfig

    parts = build(_cfg(["rollout.answer_prefix=<answer>",
                        "rollout.answer_format=<answer>{}</answer>"], "kuhn_selfplay"), tmp_path)
    policy, arena = parts.policy, parts.rollout_fn.arena
    tok = policy.tokenizer
    env = make("kuhn_poker")
    env.reset(0)
    got = probabilities_at(policy, arena, [(env, 0)])[0]
    plain = PromptBuilder(tok, PromptConfig(history="state", max_prompt_tokens=0,
                                            system_prompt=arena.prompt.system_prompt))
    ids = plain.build(env.system_prompt(0), [], env.observation(0)).ids
    ids += tok.encode("<answer>", add_special_tokens=False)
    with torch.no_grad():
        z = policy.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    legal = env.legal_actions(0)
    want = torch.softmax(z[[tok.encode(a, add_special_tokens=False)[0] for a in legal]], 0)
    for a, w in zip(legal, want.tolist()):
        assert got[a] == pytest.approx(w, rel=1e-4)
    with pytest.raises(ConfigError, match="rollout.answer_prefix: '<a>' must start"):
        _cfg(["rollout.answer_prefix=<a>", "rollout.answer_format=<answer>{}</answer>"])


def test_action_probabilities_sum_to_one_when_rounding_drifts(tmp_path, monkeypatch):
    """A move's probability is a product over its tokens; under bf16 autocast the products
    of a position can sum to 1 + 1.1e-6, which the exploitability walk would refuse. Rows
    are renormalised."""
    import sparring.eval.games as games

    policy = build(_cfg(), tmp_path).policy
    real = games.token_logprobs

    def drifting(*args, **kwargs):
        lp, ent = real(*args, **kwargs)
        return lp + 1e-6, ent  # every token a little more likely than it is

    monkeypatch.setattr(games, "token_logprobs", drifting)
    prompt = policy.tokenizer.encode("K -", add_special_tokens=False)
    got = action_probabilities(policy, [prompt], [["pass", "bet"]], "<answer>{}</answer>")[0]
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
    value = exploitability("kuhn_poker", lambda info, acts: got)
    assert 0.0 <= value <= 2.0


def test_seat_players_and_profile():
    """Who plays a game in `sparring eval` and the periodic evaluation: one policy (or a
    game that names no seats) in every seat; else each policy that owns seats, in its own."""
    from sparring.eval.periodic import seat_players, seat_profile

    assert seat_players([""], []) == [("", None)]
    assert seat_players(["a", "b"], []) == [("a", None), ("b", None)]
    assert seat_players(["b", "a", "c"], ["a", "b", "a"]) == [("b", [1]), ("a", [0, 2])]
    assert seat_profile({"a": 1, "b": 2}, ["b", "a", "b"]) == [2, 1, 2]
    assert seat_profile({"": 7}, []) == 7
