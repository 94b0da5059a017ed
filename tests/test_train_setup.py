"""The wiring of a config into the parts of a run (sparring.assembly.run)."""

from pathlib import Path

import pytest
import torch

from sparring.assembly.run import RunParts, build, load_model
from sparring.config import load_config
from sparring.rollout.rollouts import Rollouts

CONFIGS = Path(__file__).parents[1] / "configs"
TINY = ["model.options.hidden_size=32", "model.options.num_layers=1",
        "model.options.intermediate_size=64", "model.options.num_heads=2",
        "model.options.num_kv_heads=2"]


def _cfg(overrides=()):
    return load_config(CONFIGS / "default.yaml", [*TINY, "rollout.episodes_per_step=8",
                                                  "envs.0.group_size=2", *overrides])


def test_build_returns_the_typed_parts_of_a_run(tmp_path):
    parts = build(_cfg(), tmp_path)
    assert isinstance(parts, RunParts) and isinstance(parts.rollout_fn, Rollouts)
    assert parts.model is parts.policy.model and parts.tokenizer is parts.policy.tokenizer
    assert parts.stateful == {"rollouts": parts.rollout_fn}
    assert parts.pad_id == parts.tokenizer.pad_token_id


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_model_dtype_is_the_dtype_of_the_weights(dtype, tmp_path):
    cfg = _cfg([f"model.dtype={dtype}"])
    model, _ = load_model(cfg)
    assert {p.dtype for p in model.parameters()} == {getattr(torch, dtype)}
    parts = build(cfg, tmp_path)
    assert {p.dtype for p in parts.model.parameters()} == {getattr(torch, dtype)}


def test_a_bfloat16_run_trains_in_bfloat16(tmp_path):
    from sparring.train.loop import train

    cfg = _cfg(["model.dtype=bfloat16", "train.steps=1", "eval.at_start=false",
                "eval.games=2", "checkpoint.every=0", "logging.progress=false"])
    parts = build(cfg, tmp_path)
    before = [p.detach().clone() for p in parts.model.parameters()]
    train(cfg, parts.model, parts.rollout_fn, parts.eval_fn, parts.stateful,
          run_dir=tmp_path / "run", pad_id=parts.pad_id)
    after = list(parts.model.parameters())
    assert {p.dtype for p in after} == {torch.bfloat16}
    assert any(not torch.equal(a, b) for a, b in zip(after, before))


def test_a_config_without_envs_is_an_error(tmp_path):
    cfg = load_config(None, [*TINY])
    with pytest.raises(ValueError, match="no envs"):
        build(cfg, tmp_path)
