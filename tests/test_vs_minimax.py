"""The exact result of a policy against the minimax bot (sparring.eval.vs_minimax), and of a
model through `sparring.eval.games.policy_vs_minimax`."""

import random
from pathlib import Path

import pytest

from sparring.assembly.run import build
from sparring.config import load_config
from sparring.envs import make
from sparring.envs.bots.minimax import MinimaxBot, minimax_value, optimal_children
from sparring.eval.games import evaluate_vs_bot, policy_vs_minimax
from sparring.eval.vs_minimax import conversion_vs_minimax, exact_vs_minimax
from sparring.policy.sampling import SamplingParams

CONFIGS = Path(__file__).parents[1] / "configs"


def first_legal(envs, seat):
    return [{e.legal_actions(seat)[0]: 1.0} for e in envs]


def uniform(envs, seat):
    return [{a: 1 / len(e.legal_actions(seat)) for a in e.legal_actions(seat)} for e in envs]


def test_nim_2_2_by_hand():
    # Heaps (2, 2), last stone wins; the policy always takes 1 from the first non-empty heap.
    # Seat 0 (XOR 0: lost): 1:1 -> (1,2); minimax answers 2:1 -> (1,1); 1:1, minimax takes
    # the last: a loss, and no blunder (the position was lost). Seat 1: every opening of
    # minimax loses, so it picks one of 1:1, 1:2, 2:1, 2:2 uniformly; the policy answers
    # (1,2) with 1:1, (0,2) with 2:1, (2,0) with 1:1: three blunders and losses; (2,1) with
    # 1:1 -> (1,1): a win. Seat 1 wins 1/4.
    res = exact_vs_minimax(lambda: make("nim", heaps=[2, 2]), first_legal)
    assert res.win == {0: 0.0, 1: 0.25} and res.loss == {0: 1.0, 1: 0.75}
    assert res.draw == {0: 0.0, 1: 0.0}
    assert sorted((b.seat, b.action, b.value_before, b.value_after) for b in res.blunders) == \
        [(1, "1:1", 1.0, -1.0), (1, "1:1", 1.0, -1.0), (1, "2:1", 1.0, -1.0)]
    rates = res.rates()
    assert rates["non_loss"] == pytest.approx(0.125) and rates["non_loss_seat1"] == 0.25
    assert rates["blunder_states"] == 3


def test_an_optimal_policy_never_loses_and_never_blunders():
    def optimal(envs, seat):  # the minimax bot's own choice, deterministic
        out = []
        for e in envs:
            bot = MinimaxBot(0)
            out.append({bot.act(e, seat): 1.0})
        return out
    res = exact_vs_minimax(lambda: make("tictactoe"), optimal)
    assert res.loss == {0: 0.0, 1: 0.0} and res.blunders == []
    assert res.draw == {0: pytest.approx(1.0), 1: pytest.approx(1.0)}  # tic-tac-toe is a draw


def test_uniform_play_matches_a_simulation_against_the_bot():
    res = exact_vs_minimax(lambda: make("tictactoe"), uniform, greedy=False)
    rng, bot, n = random.Random(0), MinimaxBot(1), 3000
    for me in (0, 1):
        losses = 0
        for _ in range(n):
            env = make("tictactoe")
            env.reset(0)
            total = 0.0
            while (seat := env.current_seat()) is not None:
                a = rng.choice(env.legal_actions(seat)) if seat == me else bot.act(env, seat)
                total += env.step(a).rewards[me]
            losses += total < 0
        se = (res.loss[me] * (1 - res.loss[me]) / n) ** 0.5
        assert abs(losses / n - res.loss[me]) < 4 * se + 1e-3
        assert res.win[me] == 0.0  # minimax never loses


def test_the_model_exactly_matches_its_greedy_games_against_the_bot(tmp_path):
    cfg = load_config(CONFIGS / "default.yaml", [
        "model.options.hidden_size=32", "model.options.num_layers=1",
        "model.options.intermediate_size=64", "model.options.num_heads=2",
        "model.options.num_kv_heads=2"])
    parts = build(cfg, tmp_path)
    arena, policy = parts.rollout_fn.arena, parts.policy
    exact = policy_vs_minimax(arena, policy, "tictactoe", {"compact": True}).rates()
    n = 200
    played = evaluate_vs_bot(arena, policy, SamplingParams(greedy=True, max_new_tokens=2),
                             "tictactoe", {"compact": True}, MinimaxBot(5), n)
    for s in (0, 1):  # seats alternate: n / 2 games each
        p = exact[f"non_loss_seat{s}"]
        assert abs(played[f"non_loss_seat{s}"] - p) <= 5 * (p * (1 - p) / (n / 2)) ** 0.5 + 1e-9
    assert exact["win"] == 0.0


def after(env, actions):
    e = env.clone()
    for a in actions:
        e.step(a)
    return e


def test_nim_conversion_by_hand():
    # Heaps (2, 2): seat 0's every opening loses, so seat 1 is to move with a forced win at
    # (1,2), (0,2), (2,1), (2,0). Taking 1 from the first non-empty heap wins only from
    # (2,1) (-> (1,1), seat 0 takes one, seat 1 the last); from (1,2) -> (0,2),
    # (0,2) -> (0,1) and (2,0) -> (1,0) seat 0 takes the rest.
    start = make("nim", heaps=[2, 2])
    want = {after(start, [a]).observation(1): w
            for a, w in (("1:1", 0.0), ("1:2", 0.0), ("2:1", 1.0), ("2:2", 0.0))}
    got = conversion_vs_minimax(lambda: make("nim", heaps=[2, 2]), first_legal, seats=(1,),
                                plies=1)
    assert {p.observation: p.win for p in got} == want
    assert all(p.seat == 1 for p in got)


def win_probability(env, me, policy, memo):
    """P(seat ``me`` wins) from ``env``: ``policy``'s distribution at its turns, the minimax
    bot uniform over its optimal moves at the other's (a plain recursion over the tree)."""
    key = (env.state_key(), me)
    if key not in memo:
        seat = env.current_seat()
        if seat is None:
            memo[key] = 1.0 if env.returns()[me] > 0 else 0.0
        elif seat != me:
            kids = [c for _, _, c in optimal_children(env)]
            memo[key] = sum(win_probability(c, me, policy, memo) for c in kids) / len(kids)
        else:
            memo[key] = sum(p * win_probability(after(env, [a]), me, policy, memo)
                            for a, p in policy([env], me)[0].items() if p > 0)
    return memo[key]


def test_tictactoe_conversion_matches_a_tree_walk():
    start = make("tictactoe")
    want, memo = {}, {}  # won positions within 3 moves: X's after two, O's after three
    for a in start.legal_actions(0):
        for b in after(start, [a]).legal_actions(1):
            e = after(start, [a, b])
            if minimax_value(e) > 0:
                want[e.observation(0)] = win_probability(e, 0, uniform, memo)
            for c in e.legal_actions(0):
                e3 = after(e, [c])
                if e3.current_seat() == 1 and minimax_value(e3) < 0:
                    want[e3.observation(1)] = win_probability(e3, 1, uniform, memo)
    got = conversion_vs_minimax(lambda: make("tictactoe"), uniform, greedy=False)
    assert len(got) == len(want) > 0
    assert {p.observation: p.win for p in got} == pytest.approx(want)
    assert 0 < min(want.values()) < max(want.values()) < 1  # uniform play: partly converted

    def optimal(envs, seat):  # an optimal policy converts every won position
        return [{optimal_children(e)[0][0]: 1.0} for e in envs]
    assert all(p.win == pytest.approx(1.0)
               for p in conversion_vs_minimax(lambda: make("tictactoe"), optimal))


def test_a_game_without_clone_is_refused():
    with pytest.raises(TypeError, match="two-seat env"):
        exact_vs_minimax(lambda: make("arithmetic"),
                         uniform)


def test_the_periodic_evaluation_reports_the_exact_rates_against_minimax(tmp_path):
    tiny = ["model.options.hidden_size=32", "model.options.num_layers=1",
            "model.options.intermediate_size=64", "model.options.num_heads=2",
            "model.options.num_kv_heads=2", "eval.games=4"]
    cfg = load_config(CONFIGS / "default.yaml", tiny)
    parts = build(cfg, tmp_path)
    out = parts.eval_fn(0, None)
    direct = policy_vs_minimax(parts.rollout_fn.arena, parts.policy, "tictactoe",
                               dict(cfg.envs[0].options)).rates()
    assert {k: out[f"tictactoe/minimax_exact/{k}"] for k in direct} == direct
    no_minimax = build(load_config(CONFIGS / "default.yaml", [*tiny, "eval.opponents=[random]"]),
                       tmp_path / "r").eval_fn(0, None)
    assert not any("minimax_exact" in k for k in no_minimax)


def test_the_periodic_evaluation_scores_the_magnet_against_minimax_too(tmp_path):
    """With a magnet (the default's kl.reference), the exact rates of the magnet's own
    greedy play: equal to `policy_vs_minimax` of a policy over the magnet's weights."""
    from types import SimpleNamespace

    from sparring.policy.hf import HFPolicy
    from sparring.policy.tiny import build_tiny_model

    tiny = {"hidden_size": 32, "num_layers": 1, "intermediate_size": 64, "num_heads": 2,
            "num_kv_heads": 2}
    cfg = load_config(CONFIGS / "default.yaml", [f"model.options.{k}={v}" for k, v in tiny.items()]
                      + ["eval.games=4"])
    parts = build(cfg, tmp_path)
    magnet, _ = build_tiny_model({**tiny, "seed": 7})  # other weights than the policy's
    out = parts.eval_fn(0, {"": SimpleNamespace(ref_model=magnet, cfg=cfg)})
    arena, options = parts.rollout_fn.arena, dict(cfg.envs[0].options)
    direct = policy_vs_minimax(arena, HFPolicy(magnet, parts.policy.tokenizer), "tictactoe",
                               options).rates()
    assert {k: out[f"tictactoe/minimax_exact_average/{k}"] for k in direct} == direct
    own = policy_vs_minimax(arena, parts.policy, "tictactoe", options).rates()
    assert {k: out[f"tictactoe/minimax_exact/{k}"] for k in own} == own != direct
    assert not any("average" in k for k in parts.eval_fn(0, None))  # no learner, no magnet
    off = build(load_config(CONFIGS / "default.yaml", [f"model.options.{k}={v}" for k, v in
                                                       tiny.items()] + ["eval.average=false"]),
                tmp_path / "off")
    assert not any("average" in k for k in off.eval_fn(0, {"": SimpleNamespace(ref_model=magnet,
                                                                               cfg=cfg)}))
