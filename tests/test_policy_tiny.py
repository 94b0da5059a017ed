"""The tiny model: char tokenizer, chat template, parameter count, HF folder round trip."""

import pytest
import torch

from sparring.policy.tiny import (
    CHARS,
    TinyConfig,
    build_tiny_model,
    build_tokenizer,
    load_tiny,
    save_tiny,
)


def test_tokenizer_is_character_level_and_round_trips():
    tok = build_tokenizer()
    assert len(tok) == 7 + 96  # specials + printable ASCII + newline
    s = "".join(CHARS) + "Hello\n  world! <answer>a1</answer>"
    ids = tok.encode(s, add_special_tokens=False)
    assert len(ids) == len(s)
    assert tok.decode(ids) == s
    assert tok.encode("é", add_special_tokens=False) == [tok.unk_token_id]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 6)


def test_chat_template_is_compact():
    tok = build_tokenizer()
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|system|>S<|end|><|user|>hi<|end|><|assistant|>x<|end|><|user|>y<|end|><|assistant|>"
    ids = tok.encode(text, add_special_tokens=False)
    # 4 messages x (role marker + <|end|>) + 1 generation prompt, plus 5 content characters
    assert len(ids) == 4 * 2 + 1 + 5
    assert ids[0] == tok.convert_tokens_to_ids("<|system|>") and ids[-1] == tok.convert_tokens_to_ids("<|assistant|>")


def test_parameter_count_matches_formula():
    cfg = TinyConfig()
    model, tok = build_tiny_model(cfg)
    V, H, L, F = len(tok), cfg.hidden_size, cfg.num_layers, cfg.intermediate_size
    kv = H // cfg.num_heads * cfg.num_kv_heads
    per_layer = 2 * H * H + 2 * H * kv + 3 * H * F + 2 * H
    expected = V * H + L * per_layer + H
    assert sum(p.numel() for p in model.parameters()) == expected
    assert 400_000 <= expected <= 1_000_000


def test_save_load_round_trip(tmp_path):
    save_tiny(tmp_path, {"seed": 3})
    model, tok = load_tiny(tmp_path)
    ref, ref_tok = build_tiny_model({"seed": 3})
    s = "board:\n.x.\no..\n"
    assert tok.encode(s, add_special_tokens=False) == ref_tok.encode(s, add_special_tokens=False)
    assert tok.chat_template == ref_tok.chat_template and tok.eos_token == "<|end|>"
    ids = torch.tensor([ref_tok.encode(s, add_special_tokens=False)])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)
    other, _ = build_tiny_model({"seed": 4})
    with torch.no_grad():
        assert not torch.allclose(other(ids).logits, ref(ids).logits)


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="hiden"):
        build_tiny_model({"hiden": 3})
    with pytest.raises(ValueError, match="num_heads"):
        TinyConfig(hidden_size=130, num_heads=4)
