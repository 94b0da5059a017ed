"""The reference model of the KL term, ``algorithm.kl.reference``:

* ``initial``: the frozen starting model. A full model is copied once; a LoRA model needs
  no copy, since its base with the adapters disabled is the starting model.
* ``magnet``: a copy whose trained weights follow the policy's, ``m <- m + rate (w - m)``
  after every ``every``-th optimizer step (``every`` 1: an exponential moving average, the
  "magnet" of magnetic mirror descent), so the KL pulls towards a slowly moving average of
  the policy rather than its start. With ``rate`` 1 and ``every`` N it is R-NaD's outer
  loop (Perolat et al. 2022): the magnet is held fixed for N steps, during which the
  regularised game's dynamics settle near their fixed point, then replaced by the policy.
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from contextlib import AbstractContextManager, nullcontext
from typing import Literal

import torch
from torch import Tensor, nn

from sparring.policy.lora import is_peft, load_parameters


class Reference:
    """The reference of the policy ``model`` whose weights ``trained`` are trained."""

    def __init__(self, model: nn.Module, kind: Literal["initial", "magnet"], rate: float,
                 trained: Collection[str], every: int = 1):
        if every < 1:
            raise ValueError(f"Reference: every={every!r}; must be >= 1")
        self.policy, self.kind, self.rate, self.trained = model, kind, rate, trained
        self.every, self.steps = every, 0  # optimizer steps seen (checkpointed by the learner)
        self.copy: nn.Module | None = None
        self.whole: nn.Module | None = None  # the whole weights of a sharded copy (follow)
        if kind == "magnet" or not is_peft(model):
            self.copy = copy.deepcopy(model).eval()
            for p in self.copy.parameters():
                p.requires_grad_(False)

    @property
    def model(self) -> nn.Module:
        """The module to run for reference log-probs (under `context`)."""
        return self.copy if self.copy is not None else self.policy

    def context(self) -> AbstractContextManager:
        """What a reference forward runs under: the adapters disabled when the reference
        is the LoRA model's own base, else nothing."""
        return self.policy.disable_adapter() if self.copy is None else nullcontext()

    def follow(self, policy: nn.Module, *, shard: bool) -> None:
        """Refer to ``policy`` (the policy's copy the learner trains from now on: its
        sharded copy, `sparring.train.sharded_weights`) instead; ``shard``: shard the
        reference's own copy alike (a magnet, which follows the sharded weights)."""
        from sparring.train.sharded_weights import shard_copy

        self.policy = policy
        if shard and self.copy is not None:
            self.whole, self.copy = self.copy, shard_copy(self.copy)

    @property
    def whole_model(self) -> nn.Module | None:
        """The reference's own copy with its weights whole (what rank 0 evaluates; with a
        sharded copy, the weights `follow` left whole, refreshed by the learner after each
        update), else None."""
        return self.whole if self.whole is not None else self.copy

    @torch.no_grad()
    def pull(self) -> None:
        """After an optimizer step: every ``every``-th one, the magnet moves towards the
        policy's trained weights (paired by name: the model may have gained adapters since,
        pool snapshots)."""
        if self.kind != "magnet":
            return
        self.steps += 1
        if self.steps % self.every:
            return
        ref = dict(self.copy.named_parameters())
        for n, p in self.policy.named_parameters():
            if n in self.trained:
                ref[n].lerp_(p.detach(), self.rate)

    def magnet_state(self) -> dict[str, Tensor] | None:
        """The magnet's trained weights (a checkpoint's), else None."""
        if self.kind != "magnet":
            return None
        return {k: p for k, p in self.copy.named_parameters() if k in self.trained}

    def load_magnet_state(self, state: dict[str, Tensor]) -> None:
        if self.kind != "magnet":
            raise KeyError("checkpoint has magnet weights but this run has no magnet")
        load_parameters(self.copy, state)

    def frozen_state(self) -> dict[str, Tensor] | None:
        """Weights of a frozen ``initial`` copy (saved once per run), else None."""
        return self.copy.state_dict() if self.kind == "initial" and self.copy is not None \
            else None

    def load_frozen_state(self, state: dict[str, Tensor]) -> None:
        if self.kind != "initial" or self.copy is None:
            raise KeyError("this run has no frozen reference model")
        self.copy.load_state_dict(state)
