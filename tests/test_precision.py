"""Mixed precision (`sparring.policy.precision`): the mode chosen, the float32 LM head,
and bf16-mixed log-probs, loss and gradients against float32 within stated tolerances.

bf16 autocast runs on any CPU (emulated without AVX-512 BF16), so these tests hold on
every machine; the tolerances are those of bf16 compute (8 mantissa bits), not of a kernel.
"""

import copy
from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sparring.config import from_dict
from sparring.policy import precision
from sparring.policy.forward import token_logprobs
from sparring.policy.hf import HFPolicy
from sparring.policy.precision import Float32Head, autocast_for, mode_of, resolve
from sparring.policy.sampling import SamplingParams
from sparring.train.learner import Learner
from tests import train_helpers as th

pytestmark = pytest.mark.usefixtures("train_doubles")

# tolerances of bf16 compute against float32 on the small model below
LOGP_ATOL = 0.05  # nats, per token
GRAD_REL = 0.05  # ||g_bf16 - g_fp32|| / ||g_fp32||, per parameter tensor


def small_llama(seed: int = 0, tied: bool = True) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=tied))


def batch_ids(seed: int = 1, n: int = 6, T: int = 20):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 96, (n, T), generator=g)
    att = torch.ones(n, T, dtype=torch.bool)
    att[1, 15:] = False
    att[4, 9:] = False
    return ids, att


# ------------------------------------------------------------------ which mode


def test_resolve_by_hand(monkeypatch):
    big, small = 200_000_000, 100_000
    assert resolve("float32", "cpu", big).mode == "float32"
    monkeypatch.setattr(precision, "native_bf16", lambda d: (True, "CPU with AMX"))
    assert resolve("auto", "cpu", big) == precision.Resolved(
        "bf16-mixed", "auto: CPU with AMX, 200,000,000 parameters")
    tiny = resolve("auto", "cpu", small)
    assert tiny.mode == "float32" and "below 10,000,000" in tiny.reason
    # a GPU with bf16: a 200 M model stays float32 (casts and launches decide there), a
    # 2 B one is mixed; torch.device("cuda") needs no GPU to be named
    monkeypatch.setattr(precision, "native_bf16", lambda d: (True, "CUDA bf16"))
    gpu_small = resolve("auto", "cuda", big)
    assert gpu_small.mode == "float32" and "below 1,000,000,000" in gpu_small.reason
    assert resolve("auto", "cuda:0", 2_000_000_000) == precision.Resolved(
        "bf16-mixed", "auto: CUDA bf16, 2,000,000,000 parameters")
    monkeypatch.setattr(precision, "native_bf16", lambda d: (False, "no bf16 here"))
    assert resolve("auto", "cpu", big) == precision.Resolved("float32", "auto: no bf16 here")
    forced = resolve("bf16-mixed", "cpu", small)
    assert forced.mode == "bf16-mixed" and "slower than float32" in forced.reason
    # pure low-precision weights: no autocast on top, and mixed refuses them
    assert resolve("auto", "cpu", big, torch.bfloat16).mode == "float32"
    with pytest.raises(ValueError, match="keeps float32 master weights"):
        resolve("bf16-mixed", "cpu", big, torch.bfloat16)
    with pytest.raises(ValueError, match="model.precision='fp8'; allowed: auto, float32"):
        resolve("fp8", "cpu", big)


def test_the_config_refuses_an_unknown_precision():
    from sparring.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="model.precision"):
        load_config(None, ["model.precision=half"])


def test_the_default_tiny_model_stays_float32():
    """`auto` keeps the 0.14 M-parameter default model in float32 on every machine, so the
    default recipe's figures do not depend on whether the CPU has bf16."""
    from sparring.assembly.run import load_model
    from sparring.config import load_config

    model, _ = load_model(load_config(None, []))
    assert mode_of(model) == "float32"
    assert type(model.get_output_embeddings()) is torch.nn.Linear


# ------------------------------------------------------------------ the LM head


@pytest.mark.parametrize("tied", [True, False])
def test_the_head_stays_float32_with_its_weights_and_ties(tied):
    model = small_llama(tied=tied)
    keys = list(model.state_dict())
    precision.apply(model, "bf16-mixed")
    head = model.get_output_embeddings()
    assert type(head) is Float32Head and list(model.state_dict()) == keys
    assert (head.weight is model.get_input_embeddings().weight) == tied
    ids, att = batch_ids()
    seen = []
    hook = model.model.layers[0].mlp.down_proj.register_forward_hook(
        lambda _m, _a, y: seen.append(y.dtype))
    with autocast_for(model):
        out = model(input_ids=ids, attention_mask=att.long())
        inner = model.model(input_ids=ids, attention_mask=att.long()).last_hidden_state
    hook.remove()
    assert out.logits.dtype == torch.float32 and seen == [torch.bfloat16] * 2
    # the head's own product is float32 on the hidden state
    torch.testing.assert_close(out.logits, inner.float() @ head.weight.T, rtol=1e-5, atol=1e-5)
    # a copy (the magnet) and a reload keep the mode; float32 models are untouched
    assert mode_of(copy.deepcopy(model)) == "bf16-mixed"
    plain = small_llama()
    hook = plain.model.layers[0].mlp.down_proj.register_forward_hook(
        lambda _m, _a, y: seen.append(y.dtype))
    with autocast_for(plain):
        assert plain(input_ids=ids).logits.dtype == torch.float32
    hook.remove()
    assert seen[-1] == torch.float32


def test_a_saved_model_reloads_in_its_precision(tmp_path):
    model = small_llama()
    precision.apply(model, "bf16-mixed")
    model.save_pretrained(tmp_path)
    again = LlamaForCausalLM.from_pretrained(tmp_path)
    assert mode_of(again) == "bf16-mixed"
    with autocast_for(again):  # the head is made float32 on first use
        assert again(input_ids=batch_ids()[0]).logits.dtype == torch.float32


# ------------------------------------------------------------------ against float32


def test_mixed_logprobs_loss_and_gradients_match_float32(device):
    """The learner's forward (token_logprobs over a shared prompt start) and a
    policy-gradient-style loss: bf16-mixed against float32 on the same weights."""
    ref = small_llama(3).to(device)
    mixed = copy.deepcopy(ref)
    precision.apply(mixed, "bf16-mixed")
    ids, att = (t.to(device) for t in batch_ids(5))
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0)).to(device)
    out = []
    for model in (ref, mixed):
        with autocast_for(model):
            lp, ent = token_logprobs(model, ids, att, with_entropy=True)
        loss = ((lp * w + 0.1 * ent) * att).sum() / att.sum()
        loss.backward()
        out.append((lp.detach(), loss.item(), {n: p.grad for n, p in model.named_parameters()}))
    (lp0, l0, g0), (lp1, l1, g1) = out
    assert lp1.dtype == torch.float32
    assert (lp0 - lp1)[att].abs().max() < LOGP_ATOL
    assert (lp0 - lp1)[att].abs().max() > 0  # the test sees bf16 compute at all
    assert abs(l0 - l1) < LOGP_ATOL
    for n in g0:
        assert g1[n].dtype == torch.float32
        rel = float((g1[n] - g0[n]).norm() / g0[n].norm())
        assert rel < GRAD_REL, (n, rel)


def test_the_sampler_records_what_the_mixed_learner_recomputes(device):
    """Sampler and learner run the same precision context, so the old log-probs match the
    learner's recomputation to bf16 tolerance (not bit for bit: other batch shapes)."""
    model = small_llama(2).to(device)
    precision.apply(model, "bf16-mixed")

    class Tok:  # ids in, ids out: enough for generate
        eos_token_id, pad_token_id = 2, 0

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    pol = HFPolicy(model, Tok(), seed=4, device=device)
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 20 + i] for i in range(4)]
    gens = pol.generate(prompts, SamplingParams(max_new_tokens=6))
    rows = [p + g.token_ids for p, g in zip(prompts, gens)]
    T = max(map(len, rows))
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    att = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, :len(r)], att[i, :len(r)] = torch.tensor(r), True
    with torch.no_grad(), autocast_for(model):
        lp, _ = token_logprobs(model, ids.to(device), att.to(device))
    lp = lp.cpu()
    for i, (p, g) in enumerate(zip(prompts, gens)):
        got = lp[i, len(p):len(p) + len(g.token_ids)]
        assert (got - torch.tensor(g.logprobs)).abs().max() < LOGP_ATOL


def test_a_mixed_update_keeps_float32_master_weights_and_moments(device):
    """One learner update under bf16-mixed: weights, gradients and AdamW moments stay
    float32, and the step lands close to float32's (same batch, same seed)."""
    from tests.test_learner_diagnostics import shifted_batch

    cfg = from_dict({"algorithm": {"estimator": "test_centered", "objective": "ppo_clip"},
                     "train": {"steps": 1}, "optim": {"lr": 1e-3},
                     "logging": {"progress": False}})
    base = th.tiny_qwen(7)
    batch, adv = shifted_batch(base)
    after = {}
    for mode in ("float32", "bf16-mixed"):
        model = copy.deepcopy(base).to(device)
        precision.apply(model, mode)
        learner = Learner(model, cfg)
        learner.update(replace(batch), adv)
        assert all(p.dtype == torch.float32 for p in model.parameters())
        moments = [t for s in learner.optimizer.state.values() for t in s.values()
                   if torch.is_tensor(t) and t.numel() > 1]
        assert moments and all(t.dtype == torch.float32 for t in moments)
        after[mode] = {n: p.detach().cpu() for n, p in model.named_parameters()}
    before = dict(base.named_parameters())
    # the whole step as one vector (a single tensor can be pure noise: a k_proj bias has a
    # zero gradient in exact arithmetic, softmax being shift-invariant)
    steps = {m: torch.cat([(after[m][n] - before[n]).flatten() for n in before])
             for m in after}
    cos = float(torch.nn.functional.cosine_similarity(steps["float32"], steps["bf16-mixed"], 0))
    assert cos > 0.95, cos
