"""Registered components in a config: the registry of each kind a config field lists
(``envs[].starts``: start components, ``model.head``: policy heads), their errors as
`ConfigError`s naming the key, and their options as help text (`commented_yaml`); and
`EXPLORERS`, the players an ``exploration`` entry can name."""

from __future__ import annotations

from sparring.config.overrides import ConfigError
from sparring.registry import Registry, describe_options

# who can explore (``exploration``), with what their exploration does
EXPLORERS = {
    "learner": "the training policy's own seats: each random move is a training row scored "
               "with the learner's log-probs (off-policy, not reweighted), so a move self-play "
               "has stopped sampling can win back probability when it pays; needs "
               "algorithm.recompute_old_logp and rollout.layout turn",
    "league": "the league's snapshots (the pool's past policies): the learner meets "
              "positions its past selves would not reach, then their follow-up play",
}


def registry(kind: str) -> Registry:
    """The registry of components of ``kind`` ('start', 'head')."""
    if kind == "start":
        from sparring.envs.starts import STARTS
        return STARTS
    if kind == "head":
        from sparring.policy.heads import HEADS
        return HEADS
    raise KeyError(f"no components of kind {kind!r}")  # pragma: no cover


def component_error(key: str, e: Exception) -> ConfigError:
    """A component's ValueError (or unknown name) as a one-line error naming ``key``."""
    return ConfigError(f"{key}: {e.args[0] if isinstance(e, KeyError) else e}")


def describe(kind: str) -> list[str]:
    """Each component of ``kind`` with its summary, then its options (default and help), a
    line each."""
    out = []
    for entry in registry(kind):
        out.append(f"{entry.name}: {entry.summary}")
        out += [f"  {name} (default {default!r}): {help}"
                for name, default, help in describe_options(entry.fn)]
    return out


__all__ = ["EXPLORERS", "component_error", "describe", "registry"]
