"""bench/real_model.py's ``--random-weights``: a model of a folder's shape with random
weights, for a machine the real weights cannot travel to."""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

from sparring.policy.tiny import build_tiny_model
from tests.helpers import load_bench


def test_random_weights_keep_the_shape_and_the_tokenizer(tmp_path):
    """The folder holds only a config and a tokenizer (as SmolLM2's travels); the model
    built from it has that config's shape, seed-0 weights (the same twice), and the
    folder's tokenizer."""
    source = tmp_path / "source"
    _, tok = build_tiny_model({"seed": 0})
    tok.save_pretrained(source)
    LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2).save_pretrained(source)
    bench = load_bench("real_model")
    a = bench.random_weights_folder(source, tmp_path / "a")
    b = bench.random_weights_folder(source, tmp_path / "b")
    ma, mb = (AutoModelForCausalLM.from_pretrained(p) for p in (a, b))
    assert ma.config.hidden_size == 32 and ma.config.num_hidden_layers == 2
    assert all(torch.equal(x, y) for x, y in zip(ma.state_dict().values(), mb.state_dict().values()))
    assert AutoTokenizer.from_pretrained(a).encode("x.o") == tok.encode("x.o")
