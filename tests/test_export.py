"""`sparring export`: a trained run (full weights, and LoRA merged) as a plain Hugging Face
folder that transformers loads with the same log-probs as the run's policy."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from sparring import Config, Trainer
from sparring.cli import main
from sparring.policy.tiny import build_tiny_model

EXAMPLES = Path(__file__).parents[1] / "examples"

FAST = ["train.steps=1", "rollout.episodes_per_step=16", "eval.opponents=[]",
        "eval.at_start=false", "eval.exploitability=false", "logging.progress=false",
        "checkpoint.every=0"]
PROMPTS = [("", "X X..O....", "5"), ("Play well.", "O XO.X....", "9"), ("", "K", "bet")]


def _logprobs(model, tok, system, user, action):
    """Per-token log-probs of the whole chat (prompt + action), teacher-forced."""
    msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user}, {"role": "assistant", "content": action}]
    ids = tok.apply_chat_template(msgs, tokenize=True, return_dict=False)
    ids = torch.tensor([ids["input_ids"] if isinstance(ids, dict) else ids])
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    return torch.log_softmax(logits[0, :-1], -1).gather(1, ids[0, 1:, None])[:, 0]


def _check_folder(out, base_model, trained_model, trained_tok):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert not (out / "adapter_config.json").exists()
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = f.keys()
    assert names and not [k for k in names if "lora" in k]
    info = json.loads((out / "sparring_export.json").read_text())
    assert info["step"] == 1
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == trained_tok.chat_template
    moved = 0.0
    for system, user, action in PROMPTS:
        ours = _logprobs(trained_model, trained_tok, system, user, action)
        theirs = _logprobs(model, tok, system, user, action)
        torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
        base = _logprobs(base_model, trained_tok, system, user, action)
        moved = max(moved, float((theirs - base).abs().max()))
    assert moved > 1e-3  # the trained weights were exported, not the initial ones
    return info


def test_export_full_weights_through_the_cli(tmp_path):
    run = tmp_path / "run"
    trainer = Trainer("default", overrides=[*FAST, "optim.lr=0.01", f"train.run_dir={run}"])
    trainer.fit()
    out = tmp_path / "hf"
    assert main(["export", str(run), str(out)]) == 0
    base, _ = build_tiny_model(dict(trainer.config.model.options))
    info = _check_folder(out, base, trainer.model, trainer.policy.tokenizer)
    assert info["lora_merged"] is False
    assert main(["export", str(run), str(out)]) == 2  # exists: refused without --overwrite
    assert main(["export", str(run), str(out), "--overwrite"]) == 0


def test_export_merges_lora(tmp_path):
    pytest.importorskip("peft", reason="needs the 'lora' extra: pip install 'sparring[lora]'")
    from sparring.assembly.trained import load_policy
    from sparring.policy.lora import is_peft

    run = tmp_path / "run"
    cfg = Config.load(str(EXAMPLES / "lora_magnet.yaml"), [
        *FAST, "optim.lr=0.05", "optim.warmup_steps=0", "train.minibatch_size=0",
        "train.microbatch_size=0", "envs.0.group_size=4", f"train.run_dir={run}"])
    trainer = Trainer(cfg)
    trainer.fit()
    out = trainer.export(tmp_path / "hf")
    policy, _, _ = load_policy(run)  # the run's policy as eval/play rebuild it: base + adapter
    assert is_peft(policy.model)
    base, _ = build_tiny_model(dict(cfg.model.options))
    info = _check_folder(out, base, policy.model, policy.tokenizer)
    assert info["lora_merged"] is True
    _check_folder(out, base, trainer.model, trainer.policy.tokenizer)  # the in-memory policy


def test_export_errors(tmp_path):
    assert main(["export", str(tmp_path / "nothing"), str(tmp_path / "out")]) == 2
    from sparring.export import export

    with pytest.raises(ValueError, match="dtype='int8'"):
        export(tmp_path, tmp_path / "out", dtype="int8")


def test_export_never_writes_over_its_run_or_a_foreign_folder(tmp_path):
    """OUT may not overlap the run (`sparring export RUN RUN --overwrite` is refused and
    the run is untouched), and --overwrite replaces only an earlier export."""
    from sparring.storage.folders import step_dirs

    run = tmp_path / "run"
    assert main(["train", "default", *FAST, "checkpoint.every=1", f"train.run_dir={run}"]) == 0
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    ckpt = step_dirs(run)[-1][1]
    for out in (run, run / "checkpoints", ckpt, ckpt / "hf", tmp_path):
        assert main(["export", str(run), str(out), "--overwrite"]) == 2, out
        assert main(["export", str(ckpt), str(out), "--overwrite"]) == 2, out
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    assert main(["export", str(run), str(foreign), "--overwrite"]) == 2
    assert (foreign / "keep.txt").read_text() == "mine"
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # nothing touched
    out = tmp_path / "hf"
    assert main(["export", str(run), str(out)]) == 0
    assert main(["export", str(run), str(out), "--overwrite"]) == 0  # an export: replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "notes", "run"]  # no temporaries


def test_the_average_policy_is_the_magnet_the_run_evaluated(tmp_path):
    """`--average` (load_policy, export, eval, play) loads the magnet the run's own
    evaluation scored: its exploitability from the checkpoint equals the
    `exploitability_average` the run logged from the learner's in-memory magnet (and the
    plain load equals the logged `exploitability`), the export writes those weights, and a
    run without a magnet is refused by name."""
    pytest.importorskip("peft", reason="needs the 'lora' extra: pip install 'sparring[lora]'")
    from sparring.assembly.trained import load_policy
    from sparring.eval.games import policy_exploitability
    from sparring.rollout.rollouts import make_arena

    run = tmp_path / "run"
    cfg = Config.load(str(EXAMPLES / "lora_magnet.yaml"), [
        "train.steps=2", "rollout.episodes_per_step=32", "eval.at_start=false",
        "eval.opponents=[]", "logging.progress=false", "checkpoint.every=0", "eval.every=2",
        "optim.lr=0.05", "optim.warmup_steps=0", "algorithm.kl.magnet_rate=0.5",
        "train.minibatch_size=0", "train.microbatch_size=0", f"train.run_dir={run}"])
    Trainer(cfg).fit()
    last = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    arena = make_arena(cfg.rollout)
    current, _, _ = load_policy(run)
    average, _, _ = load_policy(run, average=True)
    got = policy_exploitability(arena, average, "kuhn_poker", {})
    assert got == pytest.approx(last["eval/kuhn_poker/exploitability_average"], abs=1e-5)
    assert policy_exploitability(arena, current, "kuhn_poker", {}) == pytest.approx(
        last["eval/kuhn_poker/exploitability"], abs=1e-5)
    assert abs(got - last["eval/kuhn_poker/exploitability"]) > 1e-4  # two different policies
    out = tmp_path / "hf"
    assert main(["export", str(run), str(out), "--average"]) == 0
    assert json.loads((out / "sparring_export.json").read_text())["average"] is True
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(out)
    for system, user, action in PROMPTS:
        torch.testing.assert_close(_logprobs(exported, average.tokenizer, system, user, action),
                                   _logprobs(average.model, average.tokenizer, system, user,
                                             action), atol=1e-5, rtol=0)
    plain = tmp_path / "plain"
    Trainer("default", overrides=[*FAST, f"train.run_dir={plain}", "algorithm.kl.coef=0"]).fit()
    with pytest.raises(ValueError, match="--average: this run has no average policy"):
        load_policy(plain, average=True)
    assert main(["export", str(plain), str(tmp_path / "x"), "--average"]) == 2
