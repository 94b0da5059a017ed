"""Rollout workers on Ray (sparring.distributed): the split of a step's groups, the
importance weights of async mode, the config errors without Ray, and -- with Ray, on a
local two-CPU instance and the tiny model -- that synchronous workers reproduce the
single-process run, that a worker killed mid-step is replaced without counting an
episode twice, that resume stays exact, and that async mode logs its staleness and
correction."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch

from sparring.assembly.run import build
from sparring.config import ConfigError, load_config
from sparring.config.plan import group_tasks
from sparring.distributed.split import split_groups
from sparring.importance import importance_weights, turn_ids

CONFIGS = Path(__file__).parents[1] / "configs"
# the default recipe (self-play, two random kinds, the pool) in miniature: 6 groups of 4
SMALL = ["model.options.hidden_size=32", "model.options.num_layers=1",
         "model.options.intermediate_size=64", "model.options.num_heads=2",
         "model.options.num_kv_heads=2", "rollout.episodes_per_step=24", "envs.0.group_size=4",
         "league.every=1", "train.epochs=1", "train.minibatch_size=0",
         "optim.schedule=constant", "algorithm.entropy_schedule=constant",
         "eval.at_start=false", "logging.progress=false",
         "checkpoint.every=1"]
STEPS = 3
HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="needs the ray extra (pip install "
                               "'sparring[ray]')")


def _cfg(extra=(), steps=STEPS):
    return load_config(CONFIGS / "default.yaml", [*SMALL, f"train.steps={steps}", *extra])


# ---------------------------------------------------------------- the correction


def test_the_async_correction_reads_the_learners_logprobs_from_its_values_pass():
    """A batch whose values pass also gave the learner's log-probs (``learner_logp``) is
    corrected against them without another pass; without them the learner runs one."""
    from types import SimpleNamespace

    from sparring.distributed.rollouts import RayRollouts

    cfg = _cfg(["algorithm.importance_correction={level: token, clip: 2.0}",
                "algorithm.recompute_old_logp=true"])
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]], dtype=torch.bool)
    batch = SimpleNamespace(n_rows=2, action_mask=mask, learner_logp=None,
                            old_logp=-torch.rand(2, 3, generator=g) * mask)
    batch.with_fields = lambda **kw: SimpleNamespace(**{**vars(batch), **kw})
    mine = -torch.rand(2, 3, generator=g) * mask
    passes = []
    learner = SimpleNamespace(cfg=cfg, policy_logprobs=lambda b: passes.append(b) or mine)
    async_mode = SimpleNamespace(mode="async", cfg=cfg)
    adv = torch.ones(2, 3)
    by_pass = RayRollouts.correct(async_mode, 1, batch, adv, learner)
    assert len(passes) == 1
    batch.learner_logp = mine
    kept = RayRollouts.correct(async_mode, 1, batch, adv, learner)
    assert len(passes) == 1  # no second pass
    assert torch.equal(kept[0].old_logp, mine) and torch.equal(kept[1], by_pass[1])
    want = torch.exp(mine - batch.old_logp).clamp(max=2.0) * mask
    torch.testing.assert_close(kept[1] * mask, want)


# ---------------------------------------------------------------- the split


def test_split_is_contiguous_in_group_order_and_balanced():
    shares = split_groups(list(range(12)), [16] * 12, 2)
    assert shares == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    # 12 groups for 5 workers: each group goes where its middle episode falls (fifths of 192)
    assert split_groups(list(range(12)), [16] * 12, 5) == [[0, 1], [2, 3, 4], [5, 6],
                                                           [7, 8, 9], [10, 11]]
    # sizes count: a group of 100 episodes after four of 4 (middles 2, 6, 10, 14, 66 of 116)
    assert split_groups(list("abcde"), [4, 4, 4, 4, 100], 2) == [["a", "b", "c", "d"], ["e"]]
    assert split_groups([7, 8], [4, 4], 3) == [[7], [8], []]  # fewer groups than workers
    with pytest.raises(ValueError, match="n=0"):
        split_groups([1], [1], 0)


def test_any_split_of_a_step_plays_the_same_episodes(tmp_path):
    """What sync workers rely on: each group is seeded on its own (start, model samples,
    bots, pool draws), so halves of a step, concatenated, are the whole step."""
    cfg = _cfg()
    roll = build(cfg, tmp_path).rollout_fn
    roll(0)  # (records the learner's scores against the pool: pfsp draws by them)
    tasks = group_tasks(cfg)
    roll.begin_step(1)  # step 1 adds the first snapshot to the pool: pool draws include it
    whole = roll.collect(1, tasks)  # the whole step, its scores not yet recorded
    assert [t.group for t in tasks] == list(range(6))
    assert [(t.kind, t.index) for t in tasks] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0),
                                                  (3, 0)]
    for cut in (1, 3, 5):
        parts = roll.collect(1, tasks[cut:]) + roll.collect(1, tasks[:cut])  # any order of calls
        parts = parts[len(parts) - 4 * cut:] + parts[:len(parts) - 4 * cut]
        assert [e.group for e in parts] == [e.group for e in whole]
        assert [e.info["players"] for e in parts] == [e.info["players"] for e in whole]
        assert [[t.action_ids for t in e.turns] for e in parts] == \
            [[t.action_ids for t in e.turns] for e in whole]
        # the same log-probs up to float rounding (the forward's batch is another one)
        got = [lp for e in parts for t in e.turns for lp in t.logprobs or []]
        assert got == pytest.approx([lp for e in whole for t in e.turns
                                     for lp in t.logprobs or []], abs=1e-5)
    assert "ckpt-1" in {p for e in whole for p in e.info["players"]}


# ---------------------------------------------------------------- seeded sampling


def test_seeded_sampling_follows_the_distribution_and_ignores_the_batch():
    from sparring.policy.hf import HFPolicy, _sample_rows, _uniforms
    from sparring.policy.sampling import SamplingParams
    from sparring.policy.tiny import build_tiny_model

    # inverse-CDF draws: frequencies within 4 standard errors, a zero-probability token never
    p = torch.tensor([[0.1, 0.0, 0.6, 0.3]]).expand(20000, 4)
    gens = [torch.Generator().manual_seed(i) for i in range(20000)]
    counts = torch.bincount(_sample_rows(p, _uniforms(gens)), minlength=4).float() / 20000
    se = (p[0] * (1 - p[0]) / 20000).sqrt()
    assert counts[1] == 0 and ((counts - p[0]).abs() <= 4 * se + 1e-9).all()
    # u = 1 puts u times the total on the total: the row's last token with p > 0, by hand
    edge = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.25, 0.0, 0.75, 0.0]])
    assert _sample_rows(edge, torch.tensor([1.0, 1.0])).tolist() == [1, 2]
    assert _sample_rows(edge, torch.tensor([0.49, 0.3])).tolist() == [0, 2]
    # a prompt's completion depends on its seed, not on what else is in the batch
    model, tok = build_tiny_model({"seed": 1})
    pol = HFPolicy(model, tok, seed=0)
    prompts = [tok.encode(t, add_special_tokens=False) for t in ("hi", "a longer one", "x.o")]
    sp = SamplingParams(max_new_tokens=6)
    alone = pol.generate(prompts[1:2], sp, seeds=[7])[0]
    batched = pol.generate(prompts, sp, seeds=[3, 7, 5])[1]
    assert alone.token_ids == batched.token_ids
    assert alone.logprobs == pytest.approx(batched.logprobs, abs=1e-5)
    with pytest.raises(ValueError, match="2 seeds for 3 prompts"):
        pol.generate(prompts, sp, seeds=[1, 2])


# ---------------------------------------------------------------- importance weights


def test_importance_weights_per_token_and_per_turn():
    mask = torch.tensor([[0, 1, 1, 0, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)
    assert turn_ids(mask).tolist() == [[-1, 0, 0, -1, 1], [2, 2, -1, -1, -1]]
    p_old = torch.tensor([[1.0, 0.6, 0.4, 1.0, 0.9], [0.3, 0.6, 1.0, 1.0, 1.0]])
    p_beh = torch.tensor([[0.5, 0.4, 0.5, 0.2, 0.3], [0.3, 0.2, 1.0, 1.0, 1.0]])
    w, st = importance_weights(p_old.log(), p_beh.log(), mask, level="token", clip=2.0)
    # ratios on the mask: 1.5, 0.8, 3 -> 2 | 1, 3 -> 2; 1 outside it
    want = torch.tensor([[1.0, 1.5, 0.8, 1.0, 2.0], [1.0, 2.0, 1.0, 1.0, 1.0]])
    assert torch.allclose(w, want, atol=1e-6)
    assert st["weight_mean"] == pytest.approx((1.5 + 0.8 + 2 + 1 + 2) / 5, abs=1e-6)
    assert st["weight_max"] == pytest.approx(2.0)
    assert st["truncated"] == pytest.approx(2 / 5)
    w, st = importance_weights(p_old.log(), p_beh.log(), mask, level="turn", clip=2.0)
    # turns: 1.5 * 0.8 = 1.2 | 3 -> 2 | 1 * 3 = 3 -> 2
    want = torch.tensor([[1.0, 1.2, 1.2, 1.0, 2.0], [2.0, 2.0, 1.0, 1.0, 1.0]])
    assert torch.allclose(w, want, atol=1e-6)
    assert st["weight_mean"] == pytest.approx((1.2 + 2 + 2) / 3, abs=1e-6)
    assert st["truncated"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="level='seq'"):
        importance_weights(p_old, p_beh, mask, level="seq")


# ---------------------------------------------------------------- config


@pytest.mark.parametrize("override", ["distributed.rollout_workers=2",
                                      "distributed.address=auto"])
def test_distributed_options_without_ray_name_the_key_and_the_install(monkeypatch, override):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else real(name, *a))
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key}: .*pip install 'sparring\[ray\]'"):
        _cfg([override])
    assert _cfg().distributed.rollout_workers == 0  # the defaults need nothing


@needs_ray
@pytest.mark.parametrize("args, match", [
    (["distributed.mode=async"], r"distributed.mode: async needs rollout workers"),
    (["distributed.mode=async", "distributed.rollout_workers=1", "distributed.max_staleness=0"],
     r"distributed.max_staleness: async needs >= 1"),
    (["distributed.weight_sync=nccl"], r"distributed.weight_sync"),
    (["distributed.rollout_workers=-1"], r"distributed.rollout_workers"),
])
def test_bad_distributed_options_name_the_key(args, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(args)


# ---------------------------------------------------------------- with Ray


def _metrics(run):
    return [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]


def _comparable(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/",
                                                             "distributed/"))}
            for r in rows]


def _assert_same_metrics(a, b):
    a, b = _comparable(a), _comparable(b)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for k in ra:  # the sampler's batch differs: logits agree to float rounding
            assert math.isclose(ra[k], rb[k], rel_tol=1e-4, abs_tol=1e-6), (ra["step"], k)


def _train(cfg, run, *, setup=None):
    from sparring.train.loop import train

    parts = build(cfg, run)
    try:
        if setup is not None:
            setup(parts.rollout_fn)
        train(cfg, parts.model, parts.rollout_fn, None, parts.stateful, run_dir=run,
              pad_id=parts.pad_id)
    finally:
        if hasattr(parts.rollout_fn, "close"):
            parts.rollout_fn.close()
    return _metrics(run)


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    return _train(_cfg(), tmp_path_factory.mktemp("single"))  # one thread, as the workers


@pytest.fixture(scope="module")
def local_ray():
    if not HAS_RAY:
        pytest.skip("needs the ray extra (pip install 'sparring[ray]')")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _kill_mid_step(rollouts, worker, killed, step=1):
    """SIGKILL ``worker``'s process right after ``step``'s shares are queued."""
    queue = rollouts._queue
    pid = rollouts.pids()[worker]

    def queue_then_kill(t, version):
        queue(t, version)
        if t == step and not killed:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    rollouts._queue = queue_then_kill


def test_sync_workers_reproduce_the_single_process_run_and_survive_a_kill(
        local_ray, single_process, tmp_path):
    """Two workers: the same metrics step for step. At step 1 worker 0 is SIGKILLed right
    after its share is queued: a replacement replays that share, training goes on, and the
    episodes (so the metrics) are still those of the single-process run."""
    killed = []
    rows = _train(_cfg(["distributed.rollout_workers=2"]), tmp_path,
                  setup=lambda rollouts: _kill_mid_step(rollouts, 0, killed))
    assert killed
    _assert_same_metrics(single_process, rows)
    assert [r["distributed/restarts"] for r in rows] == [0.0, 1.0, 0.0]
    assert all(r["episodes"] == 24 for r in rows)  # no share lost, none counted twice


def test_resume_with_workers_is_exact(local_ray, single_process, tmp_path):
    """Two steps with one worker, then --resume to three: the single-process metrics. The
    opponent pool (checkpointed by the driver) keeps its snapshots across the resume."""
    from sparring.train.loop import resume

    first = _train(_cfg(["distributed.rollout_workers=1"], steps=2), tmp_path)
    assert len(first) == 2
    cfg = _cfg(["distributed.rollout_workers=1"])
    parts = build(cfg, tmp_path)
    try:
        resume(tmp_path, parts.model, parts.rollout_fn, None, parts.stateful,
               overrides=["train.steps=3"], pad_id=parts.pad_id)
    finally:
        parts.rollout_fn.close()
    _assert_same_metrics(single_process, _metrics(tmp_path))


def test_pfsp_with_workers_is_the_single_process_run(local_ray, tmp_path):
    """league.mode=pfsp: the driver records the learner's scores from the workers'
    episodes and sends the pool (scores included) with each share, so two workers draw the
    league as one process does: the same metrics and the same scores at the end."""
    pfsp = ["league.mode=pfsp", "league.score_rate=0.7"]
    alone = _train(_cfg(pfsp), tmp_path / "alone")  # one thread, as the workers
    rows = _train(_cfg([*pfsp, "distributed.rollout_workers=2"]), tmp_path / "workers")
    _assert_same_metrics(alone, rows)
    scores = [json.loads((run / "checkpoints" / "step_000003" / "state.json").read_text())
              for run in (tmp_path / "alone", tmp_path / "workers")]
    assert '"scores": {"random"' in json.dumps(scores[0])
    assert scores[0] == scores[1]


def _two_policies(workers, shared, **over):
    """A speaker and a listener (each its own seat) on the tiny model, ``workers`` workers;
    ``shared``: adapters on one base."""
    from sparring.config import from_dict

    data = {"model": {"name": "tiny", "options": {
                "hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 2,
                "intermediate_size": 64}},
            "policies": {"speaker": {}, "listener": {"optim": {"lr": 3e-3}}},
            "envs": [{"name": "signalling", "options": {"k": 3}, "group_size": 4,
                      "seats": ["speaker", "listener"]}],
            "rollout": {"episodes_per_step": 8, "max_new_tokens": 8,
                        "history": "state", "system_prompt": ""},
            "algorithm": {"estimator": "grpo"}, "optim": {"lr": 1e-2},
            "train": {"steps": 2, "epochs": 1, "seed": 3},
            "eval": {"every": 0, "at_start": False},
            "checkpoint": {"every": 0}, "logging": {"progress": False},
            "distributed": {"rollout_workers": workers}, **over}
    if shared:
        data["lora"] = {"enabled": True, "shared_base": True, "r": 4}
    return from_dict(data)


@pytest.mark.parametrize("shared", [False, True], ids=["two_models", "shared_base"])
def test_two_policies_on_workers_are_the_single_process_run(local_ray, tmp_path, shared):
    """Two policies (a speaker and a listener, each its own seat) on two sync workers: the
    workers mirror every policy's weights (two models, or one base with an adapter each)
    and the pools of both, so the run's metrics are the single-process run's, per policy.
    Then async (shared base): each policy's importance weights against its own learner."""
    from sparring.config import from_dict, to_dict

    def cfg(workers):
        return _two_policies(workers, shared)

    alone = _train(cfg(0), tmp_path / "alone")
    rows = _train(cfg(2), tmp_path / "workers")
    _assert_same_metrics(alone, rows)
    assert any(k.startswith("policy/listener/") for k in rows[-1])
    assert alone[-1]["policy/speaker/policy_loss"] != alone[0]["policy/speaker/policy_loss"]
    if not shared:
        return
    # async: each policy's samples are reweighted against its own learner, the staleness
    # is the step's (both policies' weights go out together, one version a step)
    data = to_dict(cfg(2))
    data["train"]["steps"] = 3
    data["distributed"].update(mode="async", max_staleness=1)
    data["algorithm"]["importance_correction"] = {"level": "turn", "clip": 1.5}
    rows = _train(from_dict(data), tmp_path / "async")
    assert [r["distributed/staleness_max"] for r in rows] == [0.0, 1.0, 1.0]
    for name in ("speaker", "listener"):
        weights = [r[f"policy/{name}/distributed/is_weight_mean"] for r in rows]
        assert weights[0] == pytest.approx(1.0, abs=1e-4)  # step 1: the learner's own samples
        assert all(0 < w <= 1.5 for w in weights)
        assert all(math.isfinite(r[f"policy/{name}/loss"]) for r in rows)
    assert "distributed/is_weight_mean" not in rows[-1]  # only under each policy's name


def test_a_shared_base_league_on_a_worker_is_the_single_process_run(local_ray, tmp_path):
    """With lora.shared_base the pool's snapshots are adapters; the worker loads
    each into its own mirror of the model (and deletes those its pools let go), so its
    episodes, hence the metrics, are the single process's."""
    over = {"envs": [{"name": "signalling", "options": {"k": 3}, "group_size": 2,
                      "seats": ["speaker", "listener"], "opponents": ["self", "pool"]}],
            "league": {"every": 1, "max": 1}, "train": {"steps": 4, "epochs": 1, "seed": 3}}
    alone = _train(_two_policies(0, True, **over), tmp_path / "alone")
    rows = _train(_two_policies(1, True, **over), tmp_path / "worker")
    _assert_same_metrics(alone, rows)
    assert {"league/speaker/score/snapshots_mean",  # snapshots were played
            "league/listener/score/snapshots_mean"} <= set(alone[-1])


def test_async_workers_log_staleness_and_the_importance_correction(local_ray, tmp_path):
    rows = _train(_cfg(["distributed.rollout_workers=2", "distributed.mode=async",
                        "distributed.max_staleness=1",
                        "algorithm.importance_correction={level: turn, clip: 1.5}"]), tmp_path)
    assert [r["distributed/staleness_max"] for r in rows] == [0.0, 1.0, 1.0]
    assert [r["distributed/staleness_mean"] for r in rows] == [0.0, 1.0, 1.0]
    # step 1's samples are the learner's own: weights 1 up to rounding
    assert rows[0]["distributed/is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    for r in rows:
        assert 0 < r["distributed/is_weight_mean"] <= r["distributed/is_weight_max"] <= 1.5
        assert 0 <= r["distributed/is_truncated"] <= 1
        assert math.isfinite(r["loss"]) and r["episodes"] == 24
    # the ratio is taken against the recomputed old policy: 1 at the first epoch's start
    assert rows[1]["ratio"] == pytest.approx(1.0, abs=1e-3)


def test_collective_weight_sync_reproduces_the_single_process_run_and_survives_a_kill(
        local_ray, single_process, tmp_path):
    """The broadcast path (NCCL on GPUs) with gloo on CPU: same weights, same metrics. A
    worker killed at step 1 may leave the other waiting in a broadcast: both are replaced,
    get the weights through the object store, and a new group serves step 2. Closed, the
    rollouts hold no group and no rendezvous store (whose server thread would outlive them)."""
    killed, made = [], []

    def setup(rollouts):
        made.append(rollouts)
        _kill_mid_step(rollouts, 1, killed)

    rows = _train(_cfg(["distributed.rollout_workers=2", "distributed.weight_sync=collective"]),
                  tmp_path, setup=setup)
    assert killed
    assert made[0].sync.group is None and made[0].sync.store is None
    _assert_same_metrics(single_process, rows)
    assert [r["distributed/restarts"] for r in rows] == [0.0, 1.0, 0.0]
