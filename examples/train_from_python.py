"""Train from Python (notebook-sized): a recipe, a few steps, callbacks, the metrics back.

    .venv/bin/python examples/train_from_python.py

`Config.load` finds a recipe by name in configs/ (as `sparring train NAME` does) or takes
a YAML path, plus `key.sub=value` overrides. `Trainer.fit()` runs what `sparring train`
runs and returns the run's metrics, one dict per logged step. `on_step(step, metrics)`
runs after every step, `on_eval(step, metrics)` after every evaluation (step 0: before
training); raising `StopTraining` in a callback ends the run after that step.
"""

from sparring import Config, StopTraining, Trainer

cfg = Config.load("kuhn_selfplay", overrides=[
    "train.steps=4", "rollout.episodes_per_step=64", "eval.every=2", "eval.games=50",
    "logging.progress=false", "train.run_dir=runs/from-python-{time}",
])


def on_step(step: int, metrics: dict) -> None:
    print(f"step {step}: loss {metrics['loss']:+.4f}  entropy {metrics['entropy']:.3f}  "
          f"{metrics['time/rollout'] + metrics['time/update']:.1f}s")
    if metrics["invalid_rate"] > 0.5:  # an example of stopping early
        raise StopTraining


def on_eval(step: int, metrics: dict) -> None:
    print(f"eval at step {step}: win rate vs random {metrics['kuhn_poker/random/win']:.2f}, "
          f"exploitability {metrics['kuhn_poker/exploitability']:.3f}")


trainer = Trainer(cfg, on_step=on_step, on_eval=on_eval)
rows = trainer.fit()
print(f"{len(rows)} metric rows in {trainer.run_dir}")
# the trained policy as a Hugging Face folder (LoRA merged when the recipe uses LoRA)
print("exported to", trainer.export(trainer.run_dir / "hf"))
