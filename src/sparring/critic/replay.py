"""A replay buffer of recent turns for ArCHer's off-policy utterance critic.

Holds the turns (turn layout rows) of the last ``steps`` training steps as flat tensors:
the rows' tokens concatenated (``tokens [M]``, row i at ``start[i] : start[i] + length[i]``),
and per turn: first / last action-token position in its row, reward, ``done`` (the agent's
last turn), ``valid`` (has a TD target: not the last turn of a truncated episode, whose
bootstrap value is unknown), ``next`` (offset to the same agent's next turn in the buffer,
0 when there is none; found through the (trajectory, turn) grid of `advantages.scan`) and
the training step that collected it. A whole step is evicted at once, so the offsets stay
valid. Everything is a tensor on CPU: the state goes into checkpoints as it is.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from sparring.advantages.scan import from_grid, to_grid
from sparring.data import TurnBatch

_ROW_FIELDS = {"start": torch.long, "length": torch.long, "a_first": torch.long,
               "a_last": torch.long, "reward": torch.float32, "done": torch.bool,
               "valid": torch.bool, "next": torch.long, "step": torch.long}


def action_span(action_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(first, last) action-token position per row ``[n]`` of ``action_mask [n, T]``
    (rows of the turn layout: one contiguous action)."""
    if not bool(action_mask.any(1).all()):
        raise ValueError("every row needs at least one action token")
    m = action_mask.int()
    T = m.shape[1]
    return m.argmax(1), T - 1 - m.flip(1).argmax(1)


class TurnReplay:
    """The turns of the last ``steps`` training steps (see the module doc)."""

    def __init__(self, steps: int):
        if steps < 1:
            raise ValueError(f"replay steps must be >= 1, got {steps}")
        self.steps = steps
        self.tokens = torch.zeros(0, dtype=torch.long)
        self.rows = {k: torch.zeros(0, dtype=dt) for k, dt in _ROW_FIELDS.items()}

    def __len__(self) -> int:
        return int(self.rows["start"].shape[0])

    @property
    def newest_step(self) -> int:
        return int(self.rows["step"][-1]) if len(self) else -1

    def add(self, batch: TurnBatch, step: int) -> None:
        """Append ``batch``'s turns as step ``step``; drop steps older than the last ``steps``."""
        if batch.layout != "turn":
            raise ValueError(f"the replay buffer stores turn-layout batches, got {batch.layout!r}")
        if batch.n_rows == 0:
            return
        b = batch.to("cpu")
        n = b.n_rows
        length = b.attention_mask.sum(1)
        first, last = action_span(b.action_mask)
        if bool((first == 0).any()):
            raise ValueError("a turn has an empty prompt: the critic's V(s) reads the last "
                             "prompt token, so every turn needs a prompt")
        idx = torch.arange(n)
        g = to_grid(idx, b, fill=-1)  # next turn of the same agent: shift the grid left
        nxt = torch.full_like(g, -1)
        nxt[:, :-1] = g[:, 1:]
        nxt_row = from_grid(nxt, b)
        new = {"start": torch.cumsum(length, 0) - length + self.tokens.shape[0],
               "length": length, "a_first": first, "a_last": last,
               "reward": b.reward.float(), "done": b.last.bool(),
               "valid": ~(b.truncated.bool() & b.last.bool()),
               "next": torch.where(nxt_row >= 0, nxt_row - idx, 0),
               "step": torch.full((n,), step, dtype=torch.long)}
        self.tokens = torch.cat([self.tokens, b.input_ids[b.attention_mask]])
        self.rows = {k: torch.cat([self.rows[k], new[k].to(dt)]) for k, dt in _ROW_FIELDS.items()}
        self._evict(step - self.steps)

    def _evict(self, upto_step: int) -> None:
        """Drop the turns of steps ``<= upto_step`` (a prefix: steps arrive in order)."""
        drop = int((self.rows["step"] <= upto_step).sum())
        if drop == 0:
            return
        cut = int(self.rows["start"][drop]) if drop < len(self) else self.tokens.shape[0]
        self.tokens = self.tokens[cut:].clone()
        self.rows = {k: v[drop:].clone() for k, v in self.rows.items()}
        self.rows["start"] -= cut

    def sample(self, k: int, gen: torch.Generator) -> Tensor:
        """``k`` distinct buffer positions, uniformly (all of them, shuffled, when k >= len)."""
        return torch.randperm(len(self), generator=gen)[:k]

    def next_of(self, pos: Tensor) -> Tensor:
        """Position of the same agent's next turn, ``-1`` where there is none."""
        off = self.rows["next"][pos]
        return torch.where(off > 0, pos + off, -1)

    def tensors(self, pos: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Right-padded ``(input_ids [k, L], attention [k, L], a_first [k], a_last [k])``."""
        r = self.rows
        ln = r["length"][pos]
        L = int(ln.max()) if len(pos) else 1
        ar = torch.arange(L)
        att = ar[None, :] < ln[:, None]
        flat = (r["start"][pos][:, None] + ar[None, :]).clamp(max=max(self.tokens.shape[0] - 1, 0))
        ids = torch.where(att, self.tokens[flat], 0)
        return ids, att, r["a_first"][pos], r["a_last"][pos]

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "tokens": self.tokens, "rows": dict(self.rows)}

    def load_state_dict(self, st: dict[str, Any]) -> None:
        if int(st["steps"]) != self.steps:
            raise ValueError(f"the checkpoint's replay buffer keeps {st['steps']} steps, this "
                             f"run's critic.archer.buffer_steps is {self.steps}")
        self.tokens = st["tokens"].long()
        self.rows = {k: st["rows"][k].to(dt) for k, dt in _ROW_FIELDS.items()}
