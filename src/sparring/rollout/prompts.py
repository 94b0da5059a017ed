"""Render one seat's view of an episode into prompt token ids (token in, token out).

A seat's conversation is a system prompt, its past `Exchange`s (the user text it was
shown and the action tokens it sampled) and the current user text. It is rendered with
the tokenizer's chat template (our `DEFAULT_TEMPLATE` when it has none), but past actions
are spliced in as the exact sampled token ids, never re-tokenized text: the template is
rendered with a sentinel in place of each past action, the text between sentinels is
tokenized, and the sampled ids go in between. When a sampled action already ends with
EOS, the template's copy of the EOS text right after it is dropped. So in "full" mode
the prompt of turn k+1 extends ``prompt_k + action_k`` exactly (the trajectory layout
and KV reuse rely on it).

History modes (`PromptConfig.history`): "full" (all past exchanges), "last_k" (the last
``last_k`` exchanges), "state" (current user text only).

Hard limit ``max_prompt_tokens``: the oldest exchanges are dropped first; if the prompt is
still too long, tokens are cut from the left just after the system prompt (which is
always kept). `Rendered.truncated` records it (the arena puts it in
``Turn.extras["prompt_truncated"]``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from sparring.memo import BoundedMemo

HISTORY_MODES = ("full", "last_k", "state")

DEFAULT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ '\\n' }}{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{{ '\\n' }}{% endif %}"
)
_SENTINEL = "@@SPARRING_ACTION_{}@@"
_SPLIT = re.compile(r"@@SPARRING_ACTION_(\d+)@@")


@dataclass(frozen=True)
class PromptConfig:
    """history: full | last_k | state; last_k: exchanges kept in last_k mode;
    max_prompt_tokens: hard limit (0 = none); system_prompt: overrides the env's;
    answer_prefix: the text every answer starts with, put after the generation prompt (a
    prefill, e.g. "<answer>"): the model writes what follows it, and the answer is the
    prefix plus what it wrote (`answer`). Past answers keep their prefix in "full" mode."""

    history: str = "full"
    last_k: int = 2
    max_prompt_tokens: int = 2048
    system_prompt: str | None = None
    answer_prefix: str = ""

    def answer(self, written: str) -> str:
        """The whole answer a seat gave: the prefix and what the model wrote after it."""
        return self.answer_prefix + written

    def __post_init__(self) -> None:
        if self.history not in HISTORY_MODES:
            raise ValueError(f"prompt.history={self.history!r}; allowed: {', '.join(HISTORY_MODES)}")
        if self.last_k < 0:
            raise ValueError(f"prompt.last_k={self.last_k}; must be >= 0")
        if self.max_prompt_tokens < 0:
            raise ValueError(f"prompt.max_prompt_tokens={self.max_prompt_tokens}; must be >= 0")


@dataclass
class Exchange:
    """One past exchange of a seat: the user text shown and the action it sampled."""

    user: str
    action_ids: list[int]
    action_text: str = ""


@dataclass
class Rendered:
    ids: list[int]
    text: str
    truncated: bool = False
    dropped: int = 0  # past exchanges dropped to fit max_prompt_tokens
    meta: dict[str, Any] = field(default_factory=dict)


_CACHE_SIZE = 8192  # entries of each of PromptBuilder's memos


def valid_text(text: str) -> str:
    """``text`` as UTF-8 can hold it: a lone surrogate (``"\\udcff"``, e.g. from bytes
    decoded with ``surrogateescape``) becomes ``"?"``, which a tokenizer can encode; valid
    text is returned as the same object."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


class PromptBuilder:
    """Renders (system, past exchanges, current user text) to token ids for one tokenizer."""

    def __init__(self, tokenizer: Any, cfg: PromptConfig | None = None):
        self.tok = tokenizer
        self.cfg = cfg or PromptConfig()
        self.template = getattr(tokenizer, "chat_template", None) or DEFAULT_TEMPLATE
        eos = tokenizer.eos_token_id
        self.eos_id = eos
        self.eos_text = tokenizer.eos_token or ""
        self._encoded = BoundedMemo(_CACHE_SIZE)  # text -> token ids
        self._rendered = BoundedMemo(_CACHE_SIZE)  # (gen, messages) -> template text

    def _encode(self, text: str) -> list[int]:
        if not text:
            return []
        return list(self._encoded.get_or(
            text, lambda: self.tok.encode(text, add_special_tokens=False)))

    def _chat(self, messages: list[dict[str, str]], gen: bool) -> str:
        """The template's text; memoised, since concurrent episodes render the same
        observations over and over (Jinja rendering costs more than the rest of a turn)."""
        key = (gen, *((m["role"], m["content"]) for m in messages))
        return self._rendered.get_or(key, lambda: self.tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=gen, chat_template=self.template))

    def _render(self, system: str, history: list[Exchange], user: str) -> Rendered:
        msgs = [{"role": "system", "content": system}]
        prefix = valid_text(self.cfg.answer_prefix)
        for i, ex in enumerate(history):
            msgs += [{"role": "user", "content": ex.user},
                     {"role": "assistant", "content": prefix + _SENTINEL.format(i)}]
        msgs.append({"role": "user", "content": user})
        parts = _SPLIT.split(self._chat(msgs, gen=True) + prefix)
        ids = self._encode(parts[0])
        text = parts[0]
        for j in range(1, len(parts), 2):
            ex = history[int(parts[j])]
            seg = parts[j + 1]
            if ex.action_ids and ex.action_ids[-1] == self.eos_id and self.eos_text \
                    and seg.startswith(self.eos_text):
                seg = seg[len(self.eos_text):]  # the sampled EOS already ends the message
            ids += list(ex.action_ids) + self._encode(seg)
            text += ex.action_text + seg
        return Rendered(ids=ids, text=text)

    def build(self, system: str, history: list[Exchange], user: str) -> Rendered:
        """The prompt for the current turn, after the history mode and the token limit."""
        cfg = self.cfg
        system = valid_text(cfg.system_prompt if cfg.system_prompt is not None else system)
        user = valid_text(user)
        history = [ex if (u := valid_text(ex.user)) is ex.user else replace(ex, user=u)
                   for ex in history]
        if cfg.history == "state":
            history = []
        elif cfg.history == "last_k":
            history = history[len(history) - min(cfg.last_k, len(history)):]
        r = self._render(system, history, user)
        limit = cfg.max_prompt_tokens
        if not limit or len(r.ids) <= limit:
            return r
        dropped = 0
        while len(r.ids) > limit and dropped < len(history):
            dropped += 1
            r = self._render(system, history[dropped:], user)
        if len(r.ids) > limit:
            n_sys = len(self._encode(self._chat([{"role": "system", "content": system}], gen=False)))
            if n_sys >= limit:
                raise ValueError(f"the system prompt alone has {n_sys} tokens; "
                                 f"prompt.max_prompt_tokens={limit} is too small")
            ids = r.ids[:n_sys] + r.ids[len(r.ids) - (limit - n_sys):]
            r = Rendered(ids=ids, text=self.tok.decode(ids))
            r.meta["cut_tokens"] = True
        r.truncated, r.dropped = True, dropped
        return r
