"""Every recipe in configs/ runs two training steps end to end (tiny sizes), so none rots,
on the device under test (``SPARRING_TEST_DEVICE``, the CPU by default)."""

from pathlib import Path

import pytest

from sparring.assembly.run import build
from sparring.config import load_config
from sparring.train.loop import train

CONFIGS = Path(__file__).parents[1] / "configs"
RECIPES = sorted(p.stem for p in CONFIGS.glob("*.yaml") if p.stem != "reference")
SMALL = ["model.name=tiny", "model.options={hidden_size: 32, num_layers: 2, num_heads: 2, "
         "num_kv_heads: 2, intermediate_size: 64}", "rollout.episodes_per_step=8",
         "train.steps=2", "train.epochs=1", "eval.games=4", "eval.every=0",
         "checkpoint.every=0", "logging.progress=false", "lora.r=2", "lora.last_layers=0"]


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_runs_two_steps(recipe, tmp_path, device):
    raw = load_config(CONFIGS / f"{recipe}.yaml")
    groups = [f"envs.{i}.group_size={min(s.group_size, 2)}" for i, s in enumerate(raw.envs)]
    cfg = load_config(CONFIGS / f"{recipe}.yaml", [*SMALL, *groups, f"model.device={device}"])
    parts = build(cfg, tmp_path)
    run = train(cfg, parts.model, parts.rollout_fn, parts.eval_fn, parts.stateful,
                run_dir=tmp_path, pad_id=parts.pad_id)
    lines = (Path(run) / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3  # the step-0 evaluation and two steps
    assert "eval/" in lines[-1]  # games play eval.opponents, tasks held-out instances


def test_kuhn_recipe_scores_the_current_and_the_average_policy(tmp_path, device):
    cfg = load_config(CONFIGS / "kuhn_selfplay.yaml", [*SMALL, "envs.0.group_size=2",
                                                       f"model.device={device}"])
    parts = build(cfg, tmp_path)
    run = train(cfg, parts.model, parts.rollout_fn, parts.eval_fn, parts.stateful,
                run_dir=tmp_path, pad_id=parts.pad_id)
    import json
    last = json.loads((Path(run) / "metrics.jsonl").read_text().splitlines()[-1])
    cur, avg = last["eval/kuhn_poker/exploitability"], last["eval/kuhn_poker/exploitability_average"]
    assert 0 < cur < 2 and 0 < avg < 2
    assert cur != avg  # two updates moved the policy away from its slow average


def test_a_run_on_the_device_checkpoints_and_resumes(tmp_path, device):
    """Checkpoints written on the device (weights, AdamW moments, the sampler's generator)
    load back onto it: a run that lost its last step resumes from step 2's checkpoint and
    logs the uninterrupted run's step 3 (bit for bit on the CPU)."""
    import json
    import shutil

    from sparring.cli import main
    from sparring.storage.folders import step_dirs

    def rows(run):
        return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]

    full, cut = tmp_path / "full", tmp_path / "cut"
    main(["train", "kuhn_selfplay", *SMALL, "envs.0.group_size=2", f"model.device={device}",
          "checkpoint.every=1", "eval.at_start=false", "train.steps=3", f"train.run_dir={full}"])
    shutil.copytree(full, cut)
    shutil.rmtree(step_dirs(cut)[-1][1])  # as if the run died before step 3's checkpoint
    (cut / "metrics.jsonl").write_text("".join(
        json.dumps(r) + "\n" for r in rows(full) if r["step"] <= 2))
    main(["train", "--resume", str(cut)])
    want, got = rows(full), rows(cut)
    assert [r["step"] for r in got] == [1, 2, 3]
    if device.type == "cpu":  # CUDA's atomic adds need not repeat a sum bit for bit
        assert got[-1]["loss"] == want[-1]["loss"]
    else:
        assert got[-1]["loss"] == pytest.approx(want[-1]["loss"], rel=1e-3, abs=1e-5)
