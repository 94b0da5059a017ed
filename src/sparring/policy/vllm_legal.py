"""Constrained decoding inside vLLM: a batch-level logits processor over the legal-action trie.

A request that carries ``extra_args={LEGAL_KEY: sequences}`` (the token sequences of its
legal actions, each ``encode(action) + [EOS]``, as `VLLMPolicy.encode_actions` builds
them) may only follow a path of the `TokenTrie` over those sequences: before each sampling
step the processor walks the request's output tokens down the trie and sets every logit
outside the current node's children to ``-inf``. It runs before temperature and top-k/top-p
(it is not argmax-invariant), so the log-probs the engine reports with
``logprobs_mode="processed_logprobs"`` are those of the restricted, tempered distribution,
as in `sparring.policy.sampling`. Requests without the key are left alone.

This module imports vLLM; `sparring.policy.vllm` names it to the engine as
``"sparring.policy.vllm_legal:LegalActionsProcessor"`` so that an engine in another
process can import it too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from sparring.memo import BoundedMemo
from sparring.policy.sampling import TokenTrie

LEGAL_KEY = "sparring_legal"
_TRIES = BoundedMemo(4096)  # sequences -> TokenTrie, shared by every request of the process


def trie_of(sequences: list[list[int]] | tuple[tuple[int, ...], ...]) -> TokenTrie:
    key = tuple(tuple(s) for s in sequences)
    return _TRIES.get_or(key, lambda: TokenTrie(key))


@dataclass
class _Row:
    """One constrained request: its trie, its live output tokens (vLLM appends to this
    list in place), and how far down the trie they have been walked."""

    trie: TokenTrie
    output: list[int]
    node: int = 0
    walked: int = 0

    def current(self) -> int:
        while self.walked < len(self.output):
            self.node = self.trie.children[self.node].get(self.output[self.walked], -1)
            self.walked += 1
            if self.node < 0:
                raise RuntimeError("constrained decoding left the legal-action trie")
        return self.node


class LegalActionsProcessor(LogitsProcessor):
    """Masks each constrained request's logits to the children of its current trie node."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.rows: dict[int, _Row] = {}
        self.device = device

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, self._new_row)

    @staticmethod
    def _new_row(params, prompt_ids, output_ids) -> _Row | None:
        seqs = (params.extra_args or {}).get(LEGAL_KEY)
        return None if seqs is None else _Row(trie_of(seqs), output_ids)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        index = sorted(i for i in self.rows if i < logits.shape[0])
        if not index:
            return logits
        cols: list[int] = []
        rows: list[int] = []
        for k, i in enumerate(index):
            allowed = self.rows[i].trie.allowed(self.rows[i].current())
            if not allowed:  # at a leaf: the request ends on its EOS, nothing to mask
                allowed = list(range(logits.shape[1]))
            cols += allowed
            rows += [k] * len(allowed)
        keep = torch.zeros((len(index), logits.shape[1]), dtype=torch.bool)
        keep[rows, cols] = True
        sel = torch.as_tensor(index, device=logits.device)
        logits[sel] = logits[sel].masked_fill(~keep.to(logits.device), float("-inf"))
        return logits
