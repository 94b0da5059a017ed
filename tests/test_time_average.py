"""The time-average strategy of evaluated policies (sparring.envs.tree.average_strategy,
sparring.eval.time_average) and its place in a run's evaluation and checkpoints."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sparring.eval import exploitability, game_tree
from sparring.eval.time_average import StrategyHistory
from sparring.train.checkpoint import decode, encode


def random_sigma(tree, rng):
    w = rng.random(tree.n_slots) ** 2 + 1e-3
    return w / np.add.reduceat(w, tree.offset[:-1])[tree.slot_infoset]


def seat_slots(tree, seat):
    return np.array(tree.player)[tree.slot_infoset] == seat


@pytest.mark.parametrize("game", ["kuhn_poker", "leduc"])
def test_the_average_plays_like_the_mixture_of_its_policies(game):
    """Kuhn's theorem: against any fixed opponent, the averaged behaviour strategy earns what
    drawing policy k with probability w_k for the whole game earns, sum_k w_k u(sigma_k)."""
    tree, rng = game_tree(game), np.random.default_rng(0)
    sigmas = [random_sigma(tree, rng) for _ in range(3)]
    w = np.array([0.5, 0.3, 0.2])
    avg = tree.average_strategy(sigmas, w)
    for seat in (0, 1):
        mine = seat_slots(tree, seat)
        opponent = random_sigma(tree, rng)

        def root_value(own, mine=mine, opponent=opponent):
            return tree.values(np.where(mine, own, opponent))[0]

        want = sum(wk * root_value(s) for wk, s in zip(w, sigmas))
        np.testing.assert_allclose(root_value(avg), want, rtol=1e-12, atol=1e-12)
    # a plain average of the tables is another strategy (it earns something else)
    plain = np.average(sigmas, axis=0, weights=w)
    mine = seat_slots(tree, 0)
    opponent = random_sigma(tree, rng)
    assert abs(tree.values(np.where(mine, plain, opponent))[0][0]
               - tree.values(np.where(mine, avg, opponent))[0][0]) > 1e-6


def test_a_state_one_policy_never_reaches_takes_the_others_play():
    """Kuhn, seat 0: policy A bets at once, policy B passes and calls a bet. Averaged half
    and half: bet with probability 1/2 at the opening; after pass-bet, where only B gets
    to, B's call (probability 1), not the plain average's 1/2."""
    tree = game_tree("kuhn_poker")
    depth = [tree._depth[i] for i in range(len(tree.infosets))]
    a, b = np.zeros(tree.n_slots), np.zeros(tree.n_slots)
    for i, legal in enumerate(tree.actions):
        base = tree.offset[i]
        if tree.player[i] == 0 and depth[i] == 1:  # seat 0's opening
            a[base + legal.index("bet")] = 1.0
            b[base + legal.index("pass")] = 1.0
        else:  # seat 0 facing a bet (A: fold, B: call); seat 1: both bet
            a[base + legal.index("pass" if tree.player[i] == 0 else "bet")] = 1.0
            b[base + legal.index("bet")] = 1.0
    avg = tree.as_dict(tree.average_strategy([a, b]))
    for i, key in enumerate(tree.infosets):
        if tree.player[i] == 0 and depth[i] == 1:
            assert avg[key] == {"pass": 0.5, "bet": 0.5}
        elif tree.player[i] == 0:
            assert avg[key] == {"pass": 0.0, "bet": 1.0}
    assert tree.own_reach(a)[[i for i in range(len(depth)) if tree.player[i] == 0
                              and depth[i] > 1]].tolist() == [0.0] * 3


def test_average_strategy_rejects_a_bad_shape():
    tree = game_tree("kuhn_poker")
    with pytest.raises(ValueError, match=r"\[K >= 1, 24\]"):
        tree.average_strategy(np.zeros((2, 5)))
    with pytest.raises(ValueError, match="shape"):
        exploitability(tree, np.zeros(5))


def test_history_keeps_a_window_and_survives_a_checkpoint():
    tree, rng = game_tree("kuhn_poker"), np.random.default_rng(1)
    sig = {s: random_sigma(tree, rng) for s in (0, 50, 100, 150)}
    h = StrategyHistory(window=2)
    h.record("kuhn_poker", 0, sig[0])
    # one table: its own exploitability
    assert h.exploitability("kuhn_poker") == pytest.approx(exploitability(tree, sig[0]))
    for s in (50, 100, 150):
        h.record("kuhn_poker", s, sig[s])
    assert h.steps("kuhn_poker") == [100, 150]
    want = exploitability(tree, tree.average_strategy([sig[100], sig[150]]))
    assert h.exploitability("kuhn_poker") == pytest.approx(want)
    # a step evaluated again (a resumed run) replaces its table
    h.record("kuhn_poker", 150, sig[50])
    assert h.exploitability("kuhn_poker") == pytest.approx(
        exploitability(tree, tree.average_strategy([sig[100], sig[50]])))
    tensors = {}
    state = decode(json.loads(json.dumps(encode(h.state_dict(), tensors, "h"))), tensors)
    back = StrategyHistory(window=2)
    back.load_state_dict(state)
    assert back.steps("kuhn_poker") == [100, 150]
    assert back.exploitability("kuhn_poker") == h.exploitability("kuhn_poker")
    with pytest.raises(ValueError, match="no strategy of 'leduc'"):
        h.exploitability("leduc")
    with pytest.raises(ValueError, match="eval.time_average"):
        StrategyHistory(window=0)


SMALL = ["model.name=tiny", "model.options={hidden_size: 32, num_layers: 1, num_heads: 2, "
         "num_kv_heads: 2, intermediate_size: 64}", "rollout.episodes_per_step=8",
         "envs.0.group_size=2", "train.epochs=1", "eval.games=2", "eval.every=1",
         "eval.opponents=[]", "logging.progress=false"]


def test_a_run_reports_the_time_average_and_resumes_it_exactly(tmp_path):
    """eval/<game>/exploitability_time_average: at step 0 the policy's own exploitability
    (one table); later that of the last 2 tables; a run resumed from step 2's checkpoint
    logs the uninterrupted run's step 3 (the history is part of the checkpoint)."""
    from sparring.cli import main
    from sparring.storage.folders import step_dirs

    def rows(run):
        return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]

    full, cut = tmp_path / "full", tmp_path / "cut"
    key = "eval/kuhn_poker/exploitability_time_average"
    assert main(["train", "kuhn_selfplay", *SMALL, "eval.time_average=2", "checkpoint.every=1",
                 "train.steps=3", f"train.run_dir={full}"]) == 0
    want = rows(full)
    assert want[0][key] == want[0]["eval/kuhn_poker/exploitability"]
    assert want[3][key] != want[3]["eval/kuhn_poker/exploitability"]
    shutil.copytree(full, cut)
    shutil.rmtree(step_dirs(cut)[-1][1])  # as if the run died before step 3's checkpoint
    (cut / "metrics.jsonl").write_text("".join(
        json.dumps(r) + "\n" for r in want if r["step"] <= 2))
    assert main(["train", "--resume", str(cut)]) == 0
    got = rows(cut)
    assert got[-1]["step"] == 3 and got[-1][key] == want[-1][key]
    off = tmp_path / "off"
    assert main(["train", "kuhn_selfplay", *SMALL, "eval.time_average=0", "train.steps=1",
                 f"train.run_dir={off}"]) == 0
    assert not any(key in r for r in rows(Path(off)))


def test_a_checkpoint_without_the_history_resumes_with_an_empty_one(tmp_path):
    """A run checkpointed before `StrategyHistory` existed still resumes; other missing
    state stays an error."""
    from sparring.train.checkpoint import load_checkpoint, save_checkpoint

    class Counter:
        def __init__(self):
            self.n = 0

        def state_dict(self):
            return {"n": self.n}

        def load_state_dict(self, state):
            self.n = state["n"]

    saved = Counter()
    saved.n = 7
    ck = save_checkpoint(tmp_path, 3, weights={}, stateful={"counter": saved})
    history, counter = StrategyHistory(window=2), Counter()
    load_checkpoint(ck, {"counter": counter, "eval_history": history})
    assert counter.n == 7 and history.tables == {}
    with pytest.raises(KeyError, match="other"):
        load_checkpoint(ck, {"counter": counter, "other": Counter()})
