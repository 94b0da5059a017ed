"""Seeds derived from names and numbers, the same in every process.

``stable_seed(*parts)`` is ``crc32(repr(parts)) & 0x7FFFFFFF``: a 31-bit seed that depends
only on ``parts`` (ints, strings, tuples of them), unlike Python's ``hash`` of a string,
which is salted per process. The rollouts seed each group, episode and sampled turn this
way (`sparring.rollout.rollouts`, `sparring.rollout.arena`), and the vLLM backend each
prompt, so a run on Ray workers or after a resume draws what one process would.
"""

from __future__ import annotations

import zlib
from typing import Any


def stable_seed(*parts: Any) -> int:
    """A 31-bit seed from ``parts``, the same in every process."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


__all__ = ["stable_seed"]
