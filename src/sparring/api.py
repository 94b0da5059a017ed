"""Training from Python: ``Trainer(Config.load("kuhn_selfplay", overrides=[...])).fit()``.

`Trainer` runs exactly what ``sparring train`` runs (`sparring.assembly.run.build`, then
`sparring.train.loop.train`) and returns the run's metrics, one dict per logged step (the
rows of ``RUN_DIR/metrics.jsonl``; the row of step 0 holds the evaluation before training).

Callbacks: ``on_step(step, metrics)`` after every training step (``metrics``: that step's
row, its evaluation included when it had one) and ``on_eval(step, metrics)`` after every
evaluation (``metrics``: the evaluation's figures, without the ``eval/`` prefix; step 0 is
the evaluation before training). They run between steps, when the step's row is in
``metrics.jsonl`` and its checkpoint (if it had one) written: a callback may raise
`StopTraining` to end the run there; a checkpoint of the last finished step is then written
(``sparring train --resume`` continues it) and `fit` returns the metrics so far. Objects
with ``on_step`` and/or ``on_eval`` methods can be passed as ``callbacks=[...]``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from sparring.config import Config
from sparring.train.loop import StopTraining

Callback = Callable[[int, dict[str, Any]], Any]
EVAL_PREFIX = "eval/"


class _Callbacks:
    """The loop's ``on_row`` (`sparring.train.loop.train`): fires ``on_eval`` with a row's
    evaluation and ``on_step`` with a training step's row (``step`` included, as in
    ``metrics.jsonl``)."""

    def __init__(self, on_step: list[Callback], on_eval: list[Callback]):
        self.on_step, self.on_eval = on_step, on_eval

    def __call__(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **metrics}
        evals = {k[len(EVAL_PREFIX):]: v for k, v in metrics.items() if k.startswith(EVAL_PREFIX)}
        if evals:
            for cb in self.on_eval:
                cb(step, evals)
        if step > 0:
            for cb in self.on_step:
                cb(step, dict(row))


def _as_list(cb: Callback | Sequence[Callback] | None) -> list[Callback]:
    if cb is None:
        return []
    return [cb] if callable(cb) else list(cb)


class Trainer:
    """Train ``config`` (a `Config`, a recipe name, a YAML path, or None for the default run).

    ``overrides``: ``key.sub=value`` strings applied when ``config`` is a name or path;
    ``run_dir``: the run folder (default: ``train.run_dir`` filled in); ``on_step``,
    ``on_eval``: a callback or a list of them; ``callbacks``: objects with ``on_step`` /
    ``on_eval`` methods. After `fit`: ``run_dir``, ``metrics``, ``policy`` (the trained
    policy, an `sparring.policy.hf.HFPolicy`) and ``model``.
    """

    def __init__(self, config: Config | str | Path | None = None, *,
                 overrides: Sequence[str] = (), run_dir: str | Path | None = None,
                 on_step: Callback | Sequence[Callback] | None = None,
                 on_eval: Callback | Sequence[Callback] | None = None,
                 callbacks: Iterable[Any] = ()):
        if isinstance(config, Config):
            if overrides:
                raise ValueError("Trainer: overrides apply to a recipe name or path; for a "
                                 "Config use Config.load(name, overrides) or set its fields")
            self.config = config
        else:
            self.config = Config.load(config, overrides)
        self._on_step, self._on_eval = _as_list(on_step), _as_list(on_eval)
        for obj in callbacks:
            if not (hasattr(obj, "on_step") or hasattr(obj, "on_eval")):
                raise TypeError(f"Trainer: callback {obj!r} has neither on_step nor on_eval")
            if hasattr(obj, "on_step"):
                self._on_step.append(obj.on_step)
            if hasattr(obj, "on_eval"):
                self._on_eval.append(obj.on_eval)
        from sparring.train.loop import _run_dir

        self.run_dir = Path(run_dir) if run_dir is not None else _run_dir(self.config)
        self.metrics: list[dict[str, Any]] = []
        self.parts: Any = None

    @property
    def policy(self) -> Any:
        """The run's policy (trained once `fit` has run)."""
        if self.parts is None:
            raise RuntimeError("Trainer.policy: call fit() first")
        return self.parts.policy

    @property
    def model(self) -> Any:
        """The run's model (with its LoRA adapters, when the config trains some)."""
        if self.parts is None:
            raise RuntimeError("Trainer.model: call fit() first")
        return self.parts.policy.model

    def fit(self) -> list[dict[str, Any]]:
        """Train; returns the metrics rows (also in ``self.metrics``)."""
        from sparring.assembly.run import build
        from sparring.storage.metrics_file import read_metrics
        from sparring.train.loop import train

        if self.parts is not None:
            raise RuntimeError("Trainer.fit: this trainer has run; make a new Trainer (or "
                               "`sparring train --resume RUN_DIR` to continue)")
        cfg = self.config
        self.parts = parts = build(cfg, self.run_dir)
        try:
            train(cfg, parts.model, parts.rollout_fn, parts.eval_fn, parts.stateful,
                  run_dir=self.run_dir, pad_id=parts.pad_id,
                  on_row=_Callbacks(self._on_step, self._on_eval))
        finally:
            parts.close()
        self.metrics = read_metrics(self.run_dir)
        return self.metrics

    def export(self, out_dir: str | Path, **options: Any) -> Path:
        """The trained policy as a Hugging Face folder (`sparring.export.export`)."""
        from sparring.export import export

        return export(self.run_dir, out_dir, **options)


__all__ = ["Config", "StopTraining", "Trainer"]
