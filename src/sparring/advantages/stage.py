"""AdvantageStage: the one path from a collated batch to ``(advantages, keep)``.

For each environment e of the batch, on that environment's rows only (so no statistic,
batch-wide ones included, ever mixes environments, whatever the options are):

    batch_e      = reward shapers(batch_e)                      (in the configured order)
    A_e, keep_e  = estimator(batch_e, **options_e, [state=])    options_e = global <- envs[e]
    A_e          = advantage shapers(A_e, batch_e)              (in the configured order)
    keep_e      &= keep filters(A_e, batch_e)

What the stage needs from the learner (``needs``: critic ``values``, ArCHer's
``utterance_critic``, ``ref_logp``, ``entropies``) comes from the registry entries of the
estimator and the shapers; the trainer annotates the batch with those, then calls the
stage. Estimator state declared in the registry (``state=``, e.g. ``role_ema``'s running
baselines) is created and owned here, and checkpointed through `state_dict`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from sparring.advantages import ESTIMATORS, compute
from sparring.advantages.shaping import SHAPERS
from sparring.data import TurnBatch
from sparring.registry import Entry

# what the learner can put on a batch before the stage runs (TurnBatch fields / extras)
LEARNER_SUPPLIES = ("values", "utterance_critic", "ref_logp", "entropies")
ShapingSpec = str | tuple[str, Mapping[str, Any]] | Mapping[str, Any]


def _shaping_step(spec: ShapingSpec) -> tuple[Entry, dict[str, Any]]:
    """``"ucas"``, ``("ucas", {...})`` or ``{"name": "ucas", "options": {...}}``."""
    if isinstance(spec, str):
        name, opts = spec, {}
    elif isinstance(spec, Mapping):
        name, opts = spec["name"], spec.get("options") or {}
    else:
        name, opts = spec
    entry = SHAPERS.get(name)
    entry.check_options(dict(opts), "shaper")
    return entry, dict(opts)


class AdvantageStage:
    """Reward shapers -> estimator -> advantage shapers -> keep filters, per environment.

    ``options``: the estimator's keyword options; ``env_options``: per environment name,
    options that override them for that environment's rows; ``shaping``: shapers in order
    (their kind, from `SHAPERS`, says where each runs).
    """

    def __init__(self, estimator: str, options: Mapping[str, Any] | None = None, *,
                 env_options: Mapping[str, Mapping[str, Any]] | None = None,
                 shaping: Sequence[ShapingSpec] = ()):
        self.entry = ESTIMATORS.get(estimator)
        self.options = dict(options or {})
        self.env_options = {k: dict(v) for k, v in (env_options or {}).items()}
        for opts in (self.options, *self.env_options.values()):
            self.entry.check_options(opts, "estimator")
        self.shaping = [_shaping_step(s) for s in shaping]
        state_cls = self.entry.extra.get("state")
        self.state = state_cls() if state_cls is not None else None

    @property
    def layout(self) -> str:
        """The estimator's row layout: "turn", "trajectory" or "any"."""
        return self.entry.layout

    @property
    def needs(self) -> frozenset[str]:
        """What the learner must add to the batch (a subset of `LEARNER_SUPPLIES`)."""
        declared = set(self.entry.needs)
        for e, _ in self.shaping:
            declared |= set(e.needs)
        return frozenset(n for n in LEARNER_SUPPLIES if n in declared)

    def _one_env(self, batch: TurnBatch, options: dict[str, Any]) -> tuple[Tensor, Tensor]:
        for e, o in self.shaping:
            if e.family == "reward":
                batch = e.fn(batch, **o)
        if self.state is not None:
            options = {**options, "state": self.state}
        adv, keep = compute(self.entry.name, batch, **options)
        for e, o in self.shaping:
            if e.family == "advantage":
                adv = e.fn(adv, batch, **o)
        for e, o in self.shaping:
            if e.family == "keep":
                keep = keep & e.fn(adv, batch, **o)
        return adv, keep

    def __call__(self, batch: TurnBatch) -> tuple[Tensor, Tensor]:
        """Advantages ``[n_rows, T]`` (zero outside the action mask) and ``keep Bool[n_rows]``."""
        envs = torch.unique(batch.env_id).tolist()
        if len(envs) <= 1:
            name = batch.env_names[envs[0]] if envs else None
            return self._one_env(batch, {**self.options, **self.env_options.get(name, {})})
        adv = torch.zeros(batch.action_mask.shape, dtype=torch.float32, device=batch.device)
        keep = torch.ones(batch.n_rows, dtype=torch.bool, device=batch.device)
        for k in envs:
            rows = (batch.env_id == k).nonzero().squeeze(1)
            opts = {**self.options, **self.env_options.get(batch.env_names[k], {})}
            adv[rows], keep[rows] = self._one_env(batch.select(rows), opts)
        return adv, keep

    def state_dict(self) -> dict[str, Any]:
        return {} if self.state is None else {"estimator": self.state.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if (self.state is None) != ("estimator" not in state):
            raise ValueError(f"checkpointed stage state {sorted(state)} does not fit estimator "
                             f"{self.entry.name!r}")
        if self.state is not None:
            self.state.load_state_dict(state["estimator"])
