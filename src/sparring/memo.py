"""A bounded memo for values that recur in bursts (token ids, tries, template renders)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any


class BoundedMemo(dict):
    """``get_or(key, make)``: the stored value, or ``make()`` stored under ``key``. When
    ``size`` entries are held the memo empties itself first: no bookkeeping per hit, and
    the keys that matter (this rollout's legal moves and observations) come back at once."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def get_or(self, key: Hashable, make: Callable[[], Any]) -> Any:
        if key in self:
            return self[key]
        if len(self) >= self.size:
            self.clear()
        value = self[key] = make()
        return value
