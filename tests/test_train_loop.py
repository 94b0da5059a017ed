"""The loop end to end on a tiny Qwen2: metrics, checkpoints, crash checkpoint, and a run
killed with SIGKILL then resumed gives the same metrics as an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sparring.data import Episode, Turn, collate
from sparring.train.checkpoint import step_dirs
from sparring.train.config import from_dict
from sparring.train.loop import advantages, rollout_metrics, train
from sparring.train.metrics import read_metrics
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
        [sys.executable, "-m", "tests.train_resume_job", str(killed), "--block-at", "5",
         "--threads", str(torch.get_num_threads())], cwd=ROOT, env=env,
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
        "model.safetensors", "state.json", "state.safetensors"]
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]
    with pytest.raises(FileExistsError):
        train(cfg, model, rollout_fn, run_dir=tmp_path)


def _ep(env, group, ret, seat_returns=None, invalid=None):
    t = Turn(agent=0, prompt_ids=[1], action_ids=[2, 3], invalid=invalid)
    bot = Turn(agent=1, prompt_ids=[1], action_ids=[])  # a bot's move: no row
    return Episode(env=env, seed=0, group=group, num_agents=2, turns=[t, bot],
                   returns=seat_returns or [ret, -ret])


def test_per_env_estimator_options_shaping_and_rollout_metrics():
    eps = [_ep("a", 0, 1.0), _ep("a", 0, 3.0), _ep("b", 1, 0.0, invalid="illegal"),
           _ep("b", 1, 4.0)]
    batch = collate(eps)
    cfg = from_dict({"algorithm": {"estimator": "test_centered", "objective": "test_clip",
                                   "estimator_options": {"scale": 0.5},
                                   "shaping": [{"name": "test_shift", "options": {"shift": 1}}]},
                     "envs": [{"name": "tictactoe", "estimator_options": {"scale": 2.0}}]},
                    check=False)
    cfg.envs[0].name = "a"  # env names are only registry-checked by validate()
    adv, keep = advantages(batch, cfg)
    # env a: scale 2 on (R - group mean 2); env b: the global scale 0.5 on (R - 2); then +1
    assert adv[:, -1].tolist() == [2 * -1 + 1, 2 * 1 + 1, 0.5 * -2 + 1, 0.5 * 2 + 1]
    assert adv[~batch.action_mask].abs().sum() == 0
    assert keep.all()
    m = rollout_metrics(eps, batch, adv, keep)
    assert m["reward"] == (1 + 3 + 0 + 4) / 4
    assert m["env/a/return"] == 2.0 and m["env/b/return"] == 2.0
    assert m["return/seat1"] == -2.0
    assert m["invalid_rate"] == 0.25 and m["response_length"] == 2.0
    assert m["episode_length"] == 2.0
    a = torch.tensor([-1.0, 3.0, 0.0, 2.0]).repeat_interleave(2)
    assert m["adv_mean"] == pytest.approx(float(a.mean()))
    assert m["adv_std"] == pytest.approx(float(a.std()))


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
