"""Prompt rendering: exact splicing of sampled tokens, history modes, truncation."""

import pytest

from sparring.policy.tiny import build_tokenizer
from sparring.rollout.prompts import DEFAULT_TEMPLATE, Exchange, PromptBuilder, PromptConfig

TOK = build_tokenizer()
S, U, A, E = (TOK.convert_tokens_to_ids(t) for t in ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>"))


def enc(s):
    return TOK.encode(s, add_special_tokens=False)


def test_state_mode_is_system_plus_current_observation():
    b = PromptBuilder(TOK, PromptConfig(history="state"))
    r = b.build("rules", [Exchange("old", enc("a1") + [E])], "board")
    assert r.ids == [S] + enc("rules") + [E, U] + enc("board") + [E, A]
    assert not r.truncated


def test_full_history_splices_sampled_tokens_exactly():
    b = PromptBuilder(TOK, PromptConfig(history="full"))
    # a sampled action whose tokens differ from any re-tokenization: EOS then stray ids
    act0 = enc("a1") + [E]
    act1 = enc("zz")  # length-truncated: no EOS, so the template's <|end|> follows it
    r0 = b.build("sys", [], "o0")
    r1 = b.build("sys", [Exchange("o0", act0)], "o1")
    r2 = b.build("sys", [Exchange("o0", act0), Exchange("o1", act1)], "o2")
    assert r1.ids[:len(r0.ids) + len(act0)] == r0.ids + act0
    assert r1.ids == r0.ids + act0 + [U] + enc("o1") + [E, A]
    assert r2.ids == r1.ids + act1 + [E, U] + enc("o2") + [E, A]


def test_last_k_keeps_last_exchanges():
    b = PromptBuilder(TOK, PromptConfig(history="last_k", last_k=1))
    hist = [Exchange("o0", enc("x") + [E]), Exchange("o1", enc("y") + [E])]
    r = b.build("s", hist, "o2")
    assert r.ids == [S] + enc("s") + [E, U] + enc("o1") + [E, A] + enc("y") + [E, U] + enc("o2") + [E, A]


def test_truncation_drops_oldest_then_cuts_left_keeping_system():
    hist = [Exchange(f"obs{i}", enc(f"m{i}") + [E]) for i in range(3)]
    full = PromptBuilder(TOK, PromptConfig(max_prompt_tokens=0)).build("sys", hist, "now")
    # each exchange: <|user|> obsI <|end|> <|assistant|> mI <|end|> = 4 + 2 + 4 = 10 tokens
    assert len(full.ids) == 5 + 3 * 10 + 6
    b = PromptBuilder(TOK, PromptConfig(max_prompt_tokens=5 + 10 + 6))
    r = b.build("sys", hist, "now")
    assert r.truncated and r.dropped == 2
    assert r.ids == [S] + enc("sys") + [E] + full.ids[5 + 20:]
    b = PromptBuilder(TOK, PromptConfig(max_prompt_tokens=9))
    r = b.build("sys", hist, "now is long")
    assert r.truncated and r.dropped == 3 and len(r.ids) == 9
    assert r.ids == [S] + enc("sys") + [E] + enc("ng") + [E, A]
    with pytest.raises(ValueError, match="system prompt alone"):
        PromptBuilder(TOK, PromptConfig(max_prompt_tokens=4)).build("sys", hist, "now")


def test_default_template_when_tokenizer_has_none():
    tok = build_tokenizer()
    tok.chat_template = None
    b = PromptBuilder(tok, PromptConfig())
    assert b.template == DEFAULT_TEMPLATE
    act = tok.encode("go", add_special_tokens=False) + [E]
    r = b.build("S", [Exchange("u0", act)], "u1")
    head = "<|system|>\nS\n<|user|>\nu0\n<|assistant|>\n"
    assert r.ids == tok.encode(head, add_special_tokens=False) + act + tok.encode(
        "\n<|user|>\nu1\n<|assistant|>\n", add_special_tokens=False)


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="history"):
        PromptConfig(history="everything")


def test_a_lone_surrogate_is_shown_as_a_question_mark():
    """An observation with a lone surrogate is tokenized with "?" in its place (the
    tokenizer would raise a TypeError on it)."""
    b = PromptBuilder(TOK, PromptConfig(history="full"))
    past = [Exchange("seen \udcff", enc("5"), "5")]
    assert b.build("rules \udcff", past, "now \udcff").ids == \
        b.build("rules ?", [Exchange("seen ?", enc("5"), "5")], "now ?").ids


def test_answer_prefix_ends_the_prompt_and_stays_in_the_full_history():
    """`answer_prefix` is written after the generation prompt, and a past answer keeps it
    before its sampled tokens, so in full mode turn k+1's prompt still extends turn k's
    prompt plus its action exactly."""
    b = PromptBuilder(TOK, PromptConfig(history="full", answer_prefix="<a>"))
    act0 = enc("1</a>") + [E]
    r0 = b.build("sys", [], "o0")
    r1 = b.build("sys", [Exchange("o0", act0)], "o1")
    assert r0.ids == [S] + enc("sys") + [E, U] + enc("o0") + [E, A] + enc("<a>")
    assert r0.text.endswith("<a>")
    assert r1.ids[:len(r0.ids) + len(act0)] == r0.ids + act0
    assert r1.ids[len(r0.ids) + len(act0):] == [U] + enc("o1") + [E, A] + enc("<a>")
    assert b.cfg.answer("1</a>") == "<a>1</a>"
