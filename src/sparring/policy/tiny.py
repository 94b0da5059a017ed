"""The built-in tiny model: a character-level tokenizer and a small Llama-style causal LM.

* `build_tokenizer()`: a `PreTrainedTokenizerFast` whose vocabulary is printable ASCII
  (32..126) plus newline plus special tokens; one token per character, so any text made
  of those characters round-trips exactly. Specials: ``<pad> <bos> <unk>`` and the chat
  markers ``<|system|> <|user|> <|assistant|> <|end|>``; ``<|end|>`` is the EOS and ends
  every chat message. Chat template (one token per marker, compact for short contexts)::

      <|system|>{system}<|end|><|user|>{obs}<|end|><|assistant|>{action}<|end|>...

* `build_tiny_model(cfg)`: a randomly initialised ``LlamaForCausalLM`` (default about
  0.6 M parameters: hidden 128, 3 layers, 4 heads) with that tokenizer.
* `save_tiny` / `load_tiny`: a normal Hugging Face folder (``from_pretrained`` works).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS = ("<pad>", "<bos>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level fast tokenizer with pad/bos/eos/unk and a chat template."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in CHARS:
        vocab[ch] = len(vocab)
    # BPE without merges = one token per character; unknown characters -> <unk>
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<|end|>",
        unk_token="<unk>", additional_special_tokens=list(SPECIALS[3:6]),
        clean_up_tokenization_spaces=False, padding_side="left",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


TINY_LIMITS = {"hidden_size": 4096, "num_layers": 64, "num_heads": 64, "num_kv_heads": 64,
               "intermediate_size": 16384, "max_positions": 32768}


@dataclass
class TinyConfig:
    """Architecture of the tiny model (Llama-style: RMSNorm, RoPE, SwiGLU, GQA); each size
    at most its `TINY_LIMITS` entry (a tiny model's sizes, far above any use)."""

    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_positions: int = 2048
    tie_embeddings: bool = True
    seed: int = 0  # initialisation seed

    def __post_init__(self) -> None:
        for name, most in TINY_LIMITS.items():
            if getattr(self, name) > most:
                raise ValueError(f"{name}={getattr(self, name)} is out of range (must be <= "
                                 f"{most:,} for the tiny model; a larger model is a Hugging "
                                 "Face one)")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} must be divisible by "
                             f"num_heads={self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be divisible by "
                             f"num_kv_heads={self.num_kv_heads}")


def build_tiny_model(cfg: TinyConfig | dict | None = None) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A freshly initialised tiny causal LM and its tokenizer (deterministic in ``cfg.seed``)."""
    if cfg is None:
        cfg = TinyConfig()
    elif isinstance(cfg, dict):
        unknown = set(cfg) - set(asdict(TinyConfig()))
        if unknown:
            raise ValueError(f"unknown tiny model options {sorted(unknown)}; "
                             f"known: {sorted(asdict(TinyConfig()))}")
        cfg = TinyConfig(**cfg)
    tok = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size, max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=cfg.tie_embeddings, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = LlamaForCausalLM(config)
    model.eval()
    return model, tok


def save_tiny(folder: str | Path, cfg: TinyConfig | dict | None = None) -> Path:
    """Build the tiny model and save model + tokenizer as a Hugging Face folder."""
    folder = Path(folder)
    model, tok = build_tiny_model(cfg)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def load_tiny(folder: str | Path) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """Load a folder written by `save_tiny` (or any HF causal LM folder)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    model.eval()
    return model, tok
