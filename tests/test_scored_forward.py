"""`sparring.policy.scored_forward`: the top layer at the scored positions only gives the
full forward's log-probs, bonuses, hidden states and gradients there, on Llama and Qwen2
models (LoRA adapters included), and other models keep the full forward."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from sparring.config.schema import LoraConfig
from sparring.policy import forward
from sparring.policy.forward import token_logprobs, token_logprobs_and_hidden
from sparring.policy.lora import apply_lora
from sparring.policy.scored_forward import scored_positions, supports
from sparring.policy.tiny import build_tiny_model
from tests import train_helpers as th


def _llama():
    return build_tiny_model({"seed": 1, "hidden_size": 32, "num_layers": 2, "num_heads": 4,
                             "num_kv_heads": 2, "intermediate_size": 64})[0]


MODELS = {"llama": _llama, "qwen2": lambda: th.tiny_qwen(3)}


def _rows(vocab: int):
    """5 right-padded rows of lengths 4..12; scored tokens scattered as a multi-turn row's
    actions are (1 to 4 a row, not contiguous); constrained tokens among some of them."""
    g = torch.Generator().manual_seed(0)
    lengths = [12, 4, 9, 7, 10]
    n, T = len(lengths), max(lengths)
    ids = torch.randint(1, vocab, (n, T), generator=g)
    att = torch.zeros(n, T, dtype=torch.long)
    scored = torch.zeros(n, T, dtype=torch.bool)
    for i, (length, at) in enumerate(zip(lengths, ([3, 4, 9, 11], [3], [2, 8], [6], [1, 5, 6]),
                                         strict=True)):
        att[i, :length] = 1
        ids[i, length:] = 0
        scored[i, at] = True
    allowed = [{4: [2, 5, 7, ids[0, 4].item()], 11: [ids[0, 11].item(), 1]}, None,
               {8: [ids[2, 8].item(), 3]}, None, {5: [ids[4, 5].item(), 9, 10]}]
    return ids, att, scored, allowed


@pytest.mark.parametrize("via", ["top_layer", "kept_logits"])
@pytest.mark.parametrize("bonus", ["entropy", "uniform_kl", "allowed_mass"])
@pytest.mark.parametrize("name", list(MODELS))
def test_scored_positions_match_the_full_forward(name, bonus, via, monkeypatch):
    """The top layer at the scored positions alone (`scored_logits`), or the model's own
    forward with its LM head there alone (`kept_logits`, what a sharded model runs):
    log-probs, the bonus, hidden states and gradients of the full forward."""
    if via == "kept_logits":
        monkeypatch.setattr(forward, "is_sharded_module", lambda model: True)
    model = MODELS[name]()
    assert supports(model)
    ids, att, scored, allowed = _rows(model.config.vocab_size)
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    got = []
    for only in (None, scored):
        model.zero_grad()
        lp, ent, hidden = token_logprobs_and_hidden(model, ids, att, temperature=0.7,
                                                    with_entropy=True, allowed=allowed,
                                                    bonus=bonus, scored=only)
        ((lp * w + 0.3 * ent + hidden.sum(-1) * w) * scored).sum().backward()
        got.append((lp, ent, hidden, [p.grad.clone() for p in model.parameters()]))
    (lp0, e0, h0, g0), (lp1, e1, h1, g1) = got
    mask = scored.float()
    torch.testing.assert_close(lp1, lp0 * mask, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(e1, e0 * mask, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h1, h0 * mask[..., None], atol=1e-5, rtol=1e-5)
    for a, b in zip(g0, g1, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
    assert (lp1[~scored] == 0).all() and (lp1[scored] < 0).all()


def test_scored_positions_match_the_full_forward_through_lora_adapters():
    model = apply_lora(_llama(), LoraConfig(enabled=True, r=4, alpha=8,
                                            target_modules=["q_proj", "v_proj", "down_proj"]))
    with torch.no_grad():  # adapters that change the logits (B starts at 0)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(0))
    assert supports(model)
    ids, att, scored, _ = _rows(model.config.vocab_size)
    full = token_logprobs(model, ids, att)[0]
    only = token_logprobs(model, ids, att, scored=scored)[0]
    torch.testing.assert_close(only, full * scored, atol=1e-5, rtol=1e-5)


def test_other_models_keep_the_full_forward():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_embd=32, n_layer=2, n_head=2,
                                      n_positions=32))
    sliding = th.tiny_qwen(1)
    sliding.config.use_sliding_window = True
    dropout = th.tiny_qwen(1)
    dropout.config.attention_dropout = 0.1
    assert not supports(gpt2) and not supports(sliding) and supports(dropout.eval())
    assert not supports(dropout.train())
    ids, att, scored, _ = _rows(40)
    gpt2.eval()
    torch.testing.assert_close(token_logprobs(gpt2, ids, att, scored=scored)[0],
                               token_logprobs(gpt2, ids, att)[0])


def test_scored_positions_are_each_rows_in_order_padded_with_the_length():
    scored = torch.tensor([[0, 1, 0, 1, 1], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    assert scored_positions(scored).tolist() == [[1, 3, 4], [2, 5, 5], [5, 5, 5]]
    with pytest.raises(ValueError, match="position 0"):
        scored_positions(torch.tensor([[1, 0]], dtype=torch.bool))


def test_rows_without_a_scored_token_or_scored_at_position_0_take_the_full_forward():
    model = _llama()
    ids, att, _, _ = _rows(model.config.vocab_size)
    nothing = torch.zeros(ids.shape, dtype=torch.bool)
    first = nothing.clone()
    first[0, 0] = first[1, 2] = True
    for scored in (nothing, first):
        torch.testing.assert_close(token_logprobs(model, ids, att, scored=scored)[0],
                                   token_logprobs(model, ids, att)[0])
