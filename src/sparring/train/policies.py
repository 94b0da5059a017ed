"""The trained policies of a run: one, or several (``policies`` in the config).

`trained_policies(cfg, model)` gives one `TrainedPolicy` per policy: its model (LoRA
attached by `policy_models`), its `Learner` (optimizer, schedule, KL reference or magnet,
critic; from `policy_config(cfg, name)`, so a policy's own ``optim``, ``lora``, ``kl``
count) and its `AdvantageStage` (estimator state), and the names its state takes:

    ==================  ===========================  =========================
    what                one policy (no ``policies``)  policy P of several
    ==================  ===========================  =========================
    checkpoint objects  learner, stage                learner.P, stage.P
    checkpoint weights  model / adapter               model.P / adapter.P
    frozen digest meta  frozen_sha256                 frozen_sha256.P
    KL reference file   reference.safetensors         reference.P.safetensors
    metrics             the learner's own names       policy/P/<name>
    ==================  ===========================  =========================

so a run without ``policies`` reads and writes exactly what it did before they existed.
A plain model with frozen weights (``model.head`` frozen_features, top_layers) saves its
trained weights only, and the digest of the others (`TrainedPolicy.frozen_sha256`), which
a load checks against the model it rebuilds from ``model.name``.
`TrainedPolicy.rows` picks a policy's rows of a batch (``TurnBatch.policy``); the training
loop runs each policy's learner and stage on its own rows only, so every statistic an
estimator computes (group, agent, batch) is a statistic of one policy's rows.

With ``lora.shared_base`` every policy is an adapter of one PEFT model (`shared_adapters`):
the mapping `policy_models` returns holds that one model under every name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from sparring.advantages.stage import AdvantageStage
from sparring.config import Config, policy_config
from sparring.data import TurnBatch
from sparring.policy.lora import (
    apply_lora,
    frozen_sha256,
    has_frozen_weights,
    is_peft,
    load_trainable_state,
    shared_adapters,
    trainable_state,
)
from sparring.train.learner import Learner

Models = nn.Module | Mapping[str, nn.Module]


def policy_models(cfg: Config, model: Models) -> dict[str, nn.Module]:
    """``{policy name: its model}`` with LoRA attached where the policy's ``lora`` asks
    (in place; a model that is already a PEFT model is kept). Without ``policies``:
    ``{'': model}``. With ``lora.shared_base``: ``model`` (or a mapping holding that one
    model under every name) gets an adapter per policy, in ``policies`` order. Otherwise
    ``model`` is a mapping with a model per policy."""
    if not cfg.policies:
        if isinstance(model, Mapping):
            raise TypeError("a run without `policies` trains one model; got a mapping")
        return {"": apply_lora(model, cfg.lora) if cfg.lora.enabled and not is_peft(model)
                else model}
    names = list(cfg.policies)
    if cfg.lora.shared_base:
        bases = {id(m): m for m in model.values()} if isinstance(model, Mapping) else {0: model}
        if len(bases) != 1:
            raise TypeError("lora.shared_base: pass the one base model (or the same model "
                            "under every policy name)")
        base = next(iter(bases.values()))
        if not is_peft(base):
            base = shared_adapters(base, {n: policy_config(cfg, n).lora for n in names})
        return {n: base for n in names}
    if not isinstance(model, Mapping) or set(model) != set(names):
        got = sorted(model) if isinstance(model, Mapping) else type(model).__name__
        raise TypeError(f"several policies ({', '.join(names)}): pass {{name: model}} with a "
                        f"model of its own for each (got {got})")
    out = {}
    for n in names:
        lora = policy_config(cfg, n).lora
        m = model[n]
        out[n] = apply_lora(m, lora) if lora.enabled and not is_peft(m) else m
    return out


FROZEN_SHA256 = "frozen_sha256"  # checkpoint meta: `TrainedPolicy.frozen_sha256`


def state_key(base: str, policy: str | None) -> str:
    """A policy's name for ``base`` in a run's files and checkpoint state: ``base`` for the
    one policy of a run (``policy`` '' or None), ``base.NAME`` for policy NAME."""
    return f"{base}.{policy}" if policy else base


@dataclass
class TrainedPolicy:
    """One policy the run trains, and the names of its state (module docstring)."""

    name: str  # '' for the one policy of a run without `policies`
    model: nn.Module
    learner: Learner
    stage: AdvantageStage
    _frozen_sha256: str | None = field(default=None, init=False, repr=False)

    def key(self, base: str) -> str:
        """``base`` for the one policy of a run, ``base.NAME`` for policy NAME."""
        return state_key(base, self.name)

    @property
    def weights_name(self) -> str:
        return self.key("adapter" if is_peft(self.model) else "model")

    @property
    def reference_file(self) -> str:
        return f"{self.key('reference')}.safetensors"

    def metrics(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` under this policy's namespace (``policy/NAME/``; none for the one
        policy of a run)."""
        return {f"policy/{self.name}/{k}" if self.name else k: v for k, v in values.items()}

    def weights(self) -> dict[str, Tensor]:
        return trainable_state(self.model, self.learner.adapter)

    def frozen_sha256(self) -> str | None:
        """The digest of the weights `weights` leaves out (`frozen_sha256`): of a plain
        model with frozen weights only (None otherwise). They never change, so it is taken
        once."""
        if is_peft(self.model) or not has_frozen_weights(self.model):
            return None
        if self._frozen_sha256 is None:
            self._frozen_sha256 = frozen_sha256(self.model, self.weights().keys())
        return self._frozen_sha256

    def load_weights(self, state: dict[str, Tensor], frozen: str | None = None) -> None:
        """``state`` as `weights` gave it; ``frozen``: its `frozen_sha256`, for the
        trained weights of a model with frozen ones."""
        load_trainable_state(self.model, state, self.learner.adapter, frozen=frozen)

    def rows(self, batch: TurnBatch) -> Tensor | None:
        """Indices of this policy's rows of ``batch``; None (every row) for the one policy
        of a run."""
        if not self.name:
            return None
        return (batch.policy == policy_index(batch, self.name)).nonzero().squeeze(1)


def policy_index(batch: TurnBatch, name: str) -> int:
    """The index of ``name`` in ``batch.policy_names`` (-1 when no row is its)."""
    return batch.policy_names.index(name) if name in batch.policy_names else -1


def advantage_stage(cfg: Config) -> AdvantageStage:
    """The advantage stage of ``cfg``: ``algorithm.estimator``, its options and shapers, and
    each env's ``estimator_options`` (under the env's registered name, which batches carry)."""
    a = cfg.algorithm
    env_options: dict[str, dict[str, Any]] = {}
    for spec in cfg.envs:
        name = _canonical_env(spec.name)
        if env_options.get(name, spec.estimator_options) != spec.estimator_options:
            raise ValueError(f"envs lists {name!r} twice with different estimator_options")
        env_options[name] = dict(spec.estimator_options)
    return AdvantageStage(a.estimator, a.estimator_options, env_options=env_options,
                          shaping=a.shaping)


def _canonical_env(name: str) -> str:
    """The registered name of env ``name`` (an OpenSpiel alias resolves); unregistered
    names (a caller's own episodes) stay as they are."""
    from sparring.envs import env_entry
    from sparring.registry import UnknownNameError

    try:
        return env_entry(name).name
    except UnknownNameError:
        return name


def trained_policies(cfg: Config, model: Models) -> list[TrainedPolicy]:
    """The run's policies in ``policies`` order (one, named '', without them); see the
    module docstring."""
    models = policy_models(cfg, model)
    adapters = bool(cfg.policies) and cfg.lora.shared_base
    out = []
    for name, m in models.items():
        pcfg = policy_config(cfg, name) if name else cfg
        stage = advantage_stage(pcfg)
        learner = Learner(m, pcfg, needs=stage.needs, adapter=name if adapters else None)
        out.append(TrainedPolicy(name, m, learner, stage))
    return out


def check_rows(batch: TurnBatch, policies: list[TrainedPolicy]) -> None:
    """With several policies, every row of ``batch`` must be one policy's (`ValueError`)."""
    if len(policies) == 1 and not policies[0].name:
        return
    stray = [n for n in batch.policy_names if n not in {p.name for p in policies}]
    if stray:
        raise ValueError(f"rows played by {stray}, which are not policies of this run "
                         f"({', '.join(p.name for p in policies)}): a rollout with several "
                         "policies names each seat's player after its policy")
