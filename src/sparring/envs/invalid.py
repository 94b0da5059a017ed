"""The invalid-action policy: what happens when a model's text is illegal or unparsable.

Modes (chosen in config):
* ``forfeit``: the offending seat gets ``penalty`` added to its reward and the episode
  ends (other seats get 0 for that step; ``info["forfeit"] = seat``).
* ``retry``: the seat gets ``penalty`` and is asked again, with the parser's error shown,
  up to ``max_retries`` times; then it forfeits.
* ``constrained``: the policy samples only among legal actions (constrained decoding),
  so invalid actions cannot occur; a parse failure then is a bug and forfeits.
"""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("forfeit", "retry", "constrained")


@dataclass(frozen=True)
class InvalidActionPolicy:
    mode: str = "forfeit"
    penalty: float = -1.0
    max_retries: int = 2

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"invalid_action.mode={self.mode!r}; allowed: {', '.join(MODES)}")
        if self.max_retries < 0:
            raise ValueError(f"invalid_action.max_retries={self.max_retries}; must be >= 0")


def retry_feedback(error: str) -> str:
    """The text shown to an agent before it is asked again."""
    return f"Invalid move: {error}. Try again."
