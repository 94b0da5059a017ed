"""bench/gpu_pack.py: a LoRA run packed on the GPU machine unpacks here into a run folder
whose policy has the trained adapter, rounded to bf16 and nothing else."""

import tarfile

import torch
from bench.gpu_pack import pack, unpack
from safetensors.torch import load_file

from sparring.assembly.trained import load_policy
from sparring.cli import main
from sparring.policy.lora import trainable_state
from sparring.train.checkpoint import latest_intact_checkpoint

TINY_LORA = ["model.options={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 2, "
             "intermediate_size: 64}", "rollout.episodes_per_step=8", "envs.0.group_size=4",
             "eval.every=0", "eval.at_start=false", "logging.progress=false", "train.steps=1",
             "lora.enabled=true", "lora.r=4", "lora.target_modules=[q_proj,v_proj]"]


def test_pack_then_unpack_gives_the_adapter_in_bf16(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY_LORA, f"train.run_dir={run}"]) == 0
    (run / "run.log").write_text("the run's output\n")
    archive = pack(run, tmp_path / "seed0.tar.gz")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert names == {"run.log", "metrics.jsonl", "config.yaml", "adapter.bf16.safetensors",
                     "checkpoint.txt"}

    ckpt = unpack(archive, tmp_path / "back")
    trained = load_file(latest_intact_checkpoint(run) / "adapter.safetensors")
    back = load_file(ckpt / "adapter.safetensors")
    assert ckpt.name == latest_intact_checkpoint(run).name and back.keys() == trained.keys()
    for k, v in trained.items():
        assert back[k].dtype == torch.float32
        assert torch.equal(back[k], v.to(torch.bfloat16).float())
        assert torch.allclose(back[k], v, rtol=2 ** -8, atol=0)
    assert (tmp_path / "back" / "run.log").read_text() == "the run's output\n"

    policy, _, loaded_from = load_policy(tmp_path / "back", "cpu")
    assert loaded_from == ckpt
    loaded = trainable_state(policy.model)  # what the policy now holds, as saved
    assert loaded.keys() == back.keys() and len(back) > 0
    for k, v in back.items():
        assert torch.equal(loaded[k], v), k
    assert main(["train", "--resume", str(tmp_path / "back")]) == 2  # no training state
    assert "error:" in capsys.readouterr().err
