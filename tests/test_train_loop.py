"""The loop end to end on a tiny Qwen2: metrics, checkpoints, crash checkpoint, and a run
killed with SIGKILL then resumed gives the same metrics as an uninterrupted run."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sparring.config import from_dict
from sparring.data import Episode, Turn, collate
from sparring.storage.folders import step_dirs
from sparring.storage.metrics_file import read_metrics
from sparring.train.loop import train
from sparring.train.policies import advantage_stage
from sparring.train.step import rollout_metrics
from tests import train_helpers as th
from tests.train_resume_job import CONFIG, STEPS, run_job

ROOT = Path(__file__).parents[1]


pytestmark = pytest.mark.usefixtures("train_doubles")


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))}
            for r in rows]


def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.train_resume_job", str(killed), "--block-at", "5"],
        cwd=ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        run_job(full)  # the uninterrupted run, while the victim starts up
        deadline = time.time() + 120
        while not any(r["step"] == 5 for r in read_metrics(killed)):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.time() < deadline, "victim made no progress"
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)  # killed after step 5 was logged, ckpt at step 4
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [s for s, _ in step_dirs(killed)] == [2, 4]
    run_job(killed, resume_run=True)
    a, b = _strip(read_metrics(full)), _strip(read_metrics(killed))
    assert [r["step"] for r in a] == list(range(STEPS + 1))
    assert a == b
    assert "eval/p_good" in a[3] and "eval/p_good" in a[STEPS] and "eval/p_good" in a[0]
    for key in ("loss", "kl", "entropy", "clip_frac", "approx_kl", "grad_norm", "value_loss",
                "reward", "adv_std", "invalid_rate", "return/seat0", "env/bandit/return"):
        assert key in a[1], key
    assert a[1]["optimizer_steps"] == 2 * 2  # 16 rows / minibatch 8, two epochs
    assert [s for s, _ in step_dirs(full)] == [6, 8]  # keep the last two


def test_crash_writes_a_checkpoint_and_reraises(tmp_path):
    model = th.tiny_qwen(0)
    sampler = th.Sampler(1)

    def rollout_fn(step):
        if step == 2:
            raise KeyboardInterrupt
        return th.bandit_rollout(model, sampler)

    cfg = from_dict({**CONFIG, "checkpoint": {"every": 0, "keep": 3}, "eval": {"every": 0}})
    with pytest.raises(KeyboardInterrupt):
        train(cfg, model, rollout_fn, run_dir=tmp_path)
    dirs = step_dirs(tmp_path)
    assert [s for s, _ in dirs] == [2]
    doc = json.loads((dirs[0][1] / "state.json").read_text())
    assert doc["meta"]["crash"].startswith("KeyboardInterrupt")
    assert sorted(p.name for p in dirs[0][1].iterdir()) == [
        "manifest.json", "model.safetensors", "state.json", "state.safetensors"]
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]
    with pytest.raises(FileExistsError):
        train(cfg, model, rollout_fn, run_dir=tmp_path)


def _ep(env, group, ret, seat_returns=None, invalid=None):
    t = Turn(agent=0, prompt_ids=[1], action_ids=[2, 3], invalid=invalid)
    bot = Turn(agent=1, prompt_ids=[1], action_ids=[])  # a bot's move: no row
    return Episode(env=env, seed=0, group=group, num_agents=2, turns=[t, bot],
                   returns=seat_returns or [ret, -ret])


def test_per_env_estimator_options_and_rollout_metrics():
    eps = [_ep("a", 0, 1.0), _ep("a", 0, 3.0), _ep("b", 1, 0.0, invalid="illegal"),
           _ep("b", 1, 4.0)]
    batch = collate(eps)
    cfg = from_dict({"algorithm": {"estimator": "test_centered", "objective": "test_clip",
                                   "estimator_options": {"scale": 0.5}},
                     "envs": [{"name": "tictactoe", "estimator_options": {"scale": 2.0}}]},
                    check=False)
    cfg.envs[0].name = "a"  # env names are only registry-checked by validate()
    adv, keep = advantage_stage(cfg)(batch)
    # env a: scale 2 on (R - group mean 2); env b: the global scale 0.5 on (R - 2)
    assert adv[:, -1].tolist() == [2 * -1, 2 * 1, 0.5 * -2, 0.5 * 2]
    assert adv[~batch.action_mask].abs().sum() == 0
    assert keep.all()
    m = rollout_metrics(eps, batch, adv, keep)
    assert m["reward"] == (1 + 3 + 0 + 4) / 4
    assert m["env/a/return"] == 2.0 and m["env/b/return"] == 2.0
    assert m["return/seat1"] == -2.0
    assert m["invalid_rate"] == 0.25 and m["response_length"] == 2.0
    assert m["episode_length"] == 2.0 and "explored_rate" not in m
    eps[1].turns[0].extras["explored"] = 1.0  # a drawn move: not the policy's own sample
    m2 = rollout_metrics(eps, batch, adv, keep)
    assert m2["explored_rate"] == 0.25 and m2["invalid_rate"] == 1 / 3
    a = torch.tensor([-2.0, 2.0, -1.0, 1.0]).repeat_interleave(2)
    assert m["adv_mean"] == pytest.approx(float(a.mean()))
    assert m["adv_std"] == pytest.approx(float(a.std()))


SHAPING = [  # every registered shaper, in an order that interleaves the kinds
    {"name": "ucas", "options": {"alpha": 0.5, "beta": 0.1}},
    {"name": "overlong_penalty", "options": {"max_length": 2, "cache": 1, "factor": 0.5}},
    {"name": "canon", "options": {"metric": "entropy", "weight": 2.0}},
    {"name": "drop_zero_variance_groups"},
    {"name": "kl_in_reward", "options": {"beta": 2.0}},
    {"name": "loss_aversion", "options": {"weight": 3.0}},
    {"name": "positive_signalling", "options": {"beta": 0.5}},
    {"name": "entropy_shaping", "options": {"lo": 0.8, "hi": 1.25}},
    {"name": "top_abs_advantage", "options": {"k": 3}},
]


def _expected(b):
    """rloo on shaped returns (overlong, KL, loss aversion, positive signalling), then ucas,
    canon,
    entropy_shaping; keep: variance and top-3.
    Plain Python over the rows of the captured batch (one row per trajectory here)."""
    n = b.n_rows
    toks = [b.action_mask[i].nonzero().squeeze(1).tolist() for i in range(n)]
    old = [[float(b.old_logp[i, t]) for t in toks[i]] for i in range(n)]
    ref = [[float(b.ref_logp[i, t]) for t in toks[i]] for i in range(n)]
    ent = [[float(b.entropy[i, t]) for t in toks[i]] for i in range(n)]
    g = b.group.tolist()
    R = []
    for i in range(n):
        L = len(toks[i])  # max_length 2, cache 1: penalty 0 for L <= 1, (1 - L) / 1 at L = 2
        pen = 0.0 if L <= 1 else (1 - L) / 1.0
        kl = sum(o - r for o, r in zip(old[i], ref[i]))
        r = float(b.returns[i]) + 0.5 * pen - 2.0 * kl
        R.append(r if r >= 0 else 3.0 * r)  # loss_aversion, after the two above
    assert min(R) < 0 < max(R)  # loss_aversion has rewards of both signs to tell apart
    # positive_signalling: + 0.5 (log pi(m) - log p(m)), p(m) the share of rows sending m
    sent = [tuple(int(b.input_ids[i, t]) for t in toks[i]) for i in range(n)]
    assert len(set(sent)) > 1  # messages that differ, so p(m) is not 1 for all
    R = [r + 0.5 * (sum(old[i]) - math.log(sent.count(sent[i]) / n)) for i, r in enumerate(R)]
    A = []
    for i in range(n):
        others = [R[j] for j in range(n) if g[j] == g[i] and j != i]
        A.append([R[i] - sum(others) / len(others)] * len(toks[i]))
    for i in range(n):  # ucas
        c = math.exp(sum(old[i]) / len(old[i]))
        A[i] = [a * (1 + 0.5 * (1 - c)) if a > 0 else
                (a * (1 + 0.5 * c) - 0.1 * math.exp(lp) if a < 0 else 0.0)
                for a, lp in zip(A[i], old[i])]
    H = [sum(e) / len(e) for e in ent]
    a_row = [sum(a) / len(a) for a in A]
    for i in range(n):  # canon
        grp = [j for j in range(n) if g[j] == g[i]]
        xs = sorted(H[j] for j in grp)
        med = (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2
        half = [j for j in grp if (H[j] > med) == (H[i] > med)]
        mh = sum(a_row[j] for j in half) / len(half)
        mg = sum(a_row[j] for j in grp) / len(grp)
        d = (a_row[i] - mh) + 2.0 * (mh - mg) - a_row[i]
        A[i] = [a + d for a in A[i]]
    mean_h = sum(H) / n
    A = [[a * min(max(h / (mean_h + 1e-6), 0.8), 1.25) for a in row] for row, h in zip(A, H)]
    keep = []
    for i in range(n):
        grp = [j for j in range(n) if g[j] == g[i]]
        spread = max(R[j] for j in grp) > min(R[j] for j in grp)
        score = {j: sum(abs(a) for a in A[j]) / len(A[j]) for j in grp}
        rank = sorted(grp, key=lambda j: (-score[j], j)).index(i)
        keep.append(spread and rank < 3)
    return A, keep, toks


def test_every_shaper_from_the_config_on_a_non_grpo_estimator(tmp_path, monkeypatch):
    """Shaping from the config runs in the loop: two steps with every registered
    shaper on rloo; the learner receives shaper(rloo(shaped rewards)) as computed by hand."""
    from sparring.advantages.shaping import SHAPERS
    from sparring.train.learner import Learner

    assert {s["name"] for s in SHAPING} == {e.name for e in SHAPERS}
    seen = []
    update = Learner.update

    def spy(self, batch, adv, keep=None):
        seen.append((batch, adv.clone(), keep.clone()))
        return update(self, batch, adv, keep)

    monkeypatch.setattr(Learner, "update", spy)
    model, sampler = th.tiny_qwen(0), th.Sampler(5)

    def rollout_fn(step):
        eps = th.bandit_rollout(model, sampler)
        for k, ep in enumerate(eps):  # every third episode answers with one token
            if k % 3 == 0:
                t = ep.turns[0]
                t.action_ids, t.logprobs = t.action_ids[:1], t.logprobs[:1]
        return eps

    cfg = from_dict({"algorithm": {"estimator": "rloo", "objective": "ppo_clip",
                                   "shaping": SHAPING},
                     "optim": {"lr": 3e-2}, "train": {"steps": 2, "seed": 3},
                     "eval": {"at_start": False}, "logging": {"progress": False}})
    train(cfg, model, rollout_fn, run_dir=tmp_path)
    assert len(seen) == 2
    for batch, adv, keep in seen:
        A, want_keep, toks = _expected(batch)
        for i in range(batch.n_rows):
            assert adv[i, toks[i]].tolist() == pytest.approx(A[i], abs=1e-5)
        assert adv[~batch.action_mask].abs().sum() == 0
        assert keep.tolist() == want_keep
    kl = (seen[1][0].old_logp - seen[1][0].ref_logp).abs().sum()
    assert kl > 1e-4  # after one update the policy has moved from the reference


def test_initial_reference_is_saved_once_and_resume_extends_a_run(tmp_path):
    from safetensors.torch import load_file

    from sparring.train.loop import resume

    def job(model):
        sampler = th.Sampler(2)
        return model, (lambda step: th.bandit_rollout(model, sampler)), {"sampler": sampler}

    cfg = from_dict({**CONFIG, "algorithm": {**CONFIG["algorithm"], "kl": {"coef": 0.1}},
                     "train": {**CONFIG["train"], "steps": 2}, "eval": {"every": 0}})
    model, fn, st = job(th.tiny_qwen(0))
    train(cfg, model, fn, stateful=st, run_dir=tmp_path)
    ref = load_file(str(tmp_path / "reference.safetensors"))
    init = th.tiny_qwen(0).state_dict()
    assert set(ref) == set(init) and all(torch.equal(ref[k], init[k]) for k in init)
    model, fn, st = job(th.tiny_qwen(0))
    resume(tmp_path, model, fn, stateful=st, overrides=["train.steps=3"])
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[2]["kl"] > 0
    assert [s for s, _ in step_dirs(tmp_path)] == [2, 3]


def _best_job(model, scores):
    """A bandit run whose evaluation reports ``scores[step]`` as ``eval/score``."""
    sampler = th.Sampler(3)
    return ((lambda step: th.bandit_rollout(model, sampler)),
            (lambda step, learners: {"score": scores[step]}), {"sampler": sampler})


def test_the_best_checkpoint_outlives_keep_and_resumes_with_its_record(tmp_path):
    from sparring.train.loop import resume

    scores = {0: 0.1, 1: 3.0, 2: 4.0, 3: 1.0, 4: 2.0, 5: 0.5, 6: 6.0}  # 0: not a training step
    cfg = from_dict({**CONFIG, "train": {**CONFIG["train"], "steps": 4},
                     "eval": {"every": 1}, "checkpoint": {
                         "every": 0, "keep": 1, "best_metric": "eval/score"}})
    model = th.tiny_qwen(0)
    fn, ev, st = _best_job(model, scores)
    train(cfg, model, fn, ev, st, run_dir=tmp_path)
    best = json.loads((tmp_path / "checkpoints" / "best.json").read_text())
    assert (best["step"], best["value"], best["path"]) == (3, 1.0, "step_000003")
    assert [s for s, _ in step_dirs(tmp_path)] == [3, 4]  # the best (3), the last (4)
    model = th.tiny_qwen(0)
    fn, ev, st = _best_job(model, scores)
    resume(tmp_path, model, fn, ev, st, overrides=["train.steps=6"])
    best = json.loads((tmp_path / "checkpoints" / "best.json").read_text())
    assert (best["step"], best["value"]) == (5, 0.5)  # 2.0 at step 4 did not beat 1.0
    assert [s for s, _ in step_dirs(tmp_path)] == [5, 6]


def test_best_mode_max_and_a_metric_never_logged(tmp_path):
    scores = {0: 0.0, 1: 2.0, 2: 1.0, 3: 2.0}  # a tie is no improvement
    cfg = from_dict({**CONFIG, "train": {**CONFIG["train"], "steps": 3},
                     "eval": {"every": 1}, "checkpoint": {
                         "every": 0, "keep": 1, "best_metric": "eval/score",
                         "best_mode": "max"}})
    model = th.tiny_qwen(0)
    train(cfg, model, *_best_job(model, scores), run_dir=tmp_path / "a")
    assert json.loads((tmp_path / "a/checkpoints/best.json").read_text())["step"] == 1
    assert [s for s, _ in step_dirs(tmp_path / "a")] == [1, 3]
    bad = from_dict({**CONFIG, "eval": {"every": 1}, "checkpoint": {
        "best_metric": "eval/scroe"}})
    with pytest.raises(ValueError, match=r"best_metric='eval/scroe'.*eval/score"):
        train(bad, model, *_best_job(model, scores), run_dir=tmp_path / "b")
    with pytest.raises(ValueError, match="best_mode"):
        from_dict({**CONFIG, "checkpoint": {"best_mode": "lowest"}})


def test_the_loop_uses_the_hooks_a_rollout_source_offers(tmp_path):
    """A source with `league_metrics`, `rollout_metrics` and `correct`
    (sparring.rollout.source) has its rows logged and its correction applied (here:
    advantages zeroed, so the update moves nothing); a plain function offers none."""
    from sparring.rollout.source import (
        CorrectsStaleSamples,
        ReportsLeague,
        ReportsRolloutMetrics,
    )

    model = th.tiny_qwen(0)
    sampler = th.Sampler(1)

    class Source:
        def __call__(self, step):
            return th.bandit_rollout(model, sampler)

        def league_metrics(self):
            return {"league/score/test_bot": 0.25}

        def rollout_metrics(self):
            return {"distributed/test_workers": 2.0}

        def correct(self, step, batch, adv, learner):
            return batch, adv * 0, {"distributed/test_hook": float(step)}

    hooks = (CorrectsStaleSamples, ReportsLeague, ReportsRolloutMetrics)
    assert all(isinstance(Source(), h) for h in hooks)
    assert not any(isinstance(lambda step: [], h) for h in hooks)
    cfg = from_dict({"algorithm": {"estimator": "test_centered", "objective": "test_clip"},
                     "optim": {"lr": 1e-2, "weight_decay": 0.0}, "train": {"steps": 2},
                     "checkpoint": {"every": 0}, "eval": {"every": 0},
                     "logging": {"progress": False}})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    train(cfg, model, Source(), run_dir=tmp_path)
    rows = read_metrics(tmp_path)
    assert [r["league/score/test_bot"] for r in rows] == [0.25, 0.25]
    assert [r["distributed/test_hook"] for r in rows] == [0.0, 1.0]
    assert [r["distributed/test_workers"] for r in rows] == [2.0, 2.0]
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_objects_alive_at_the_start_are_out_of_the_collector_only_while_training(tmp_path):
    import gc
    import weakref

    class Node:
        pass

    model = th.tiny_qwen(0)
    sampler = th.Sampler(1)
    garbage = Node()
    garbage.self = garbage  # a cycle: only the cyclic collector frees it
    gone = weakref.ref(garbage)
    del garbage
    seen: list[tuple[int, bool]] = []

    def on_row(step, row):
        seen.append((gc.get_freeze_count(), gone() is None))

    cfg = from_dict({**CONFIG, "train": {**CONFIG["train"], "steps": 2},
                     "checkpoint": {"every": 0, "keep": 3}, "eval": {"every": 0}})
    before = gc.get_freeze_count()
    gc.disable()  # only the run's own collection at its start may free the cycle
    try:
        train(cfg, model, lambda step: th.bandit_rollout(model, sampler), run_dir=tmp_path,
              on_row=on_row)
    finally:
        gc.enable()
    assert len(seen) == 2 and all(n > before + 10_000 and freed for n, freed in seen)
    assert gc.get_freeze_count() == before

    def crash(step):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, model, crash, run_dir=tmp_path / "crashed")
    assert gc.get_freeze_count() == before
