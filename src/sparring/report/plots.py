"""``sparring report RUN_DIR``: PNG learning curves, evaluation plots and a markdown summary.

Reads ``metrics.jsonl`` (and ``config.yaml`` when present) and writes into
``RUN_DIR/report/``: ``training.png`` (one panel per training metric, raw and smoothed),
``timing.png`` (time split and throughput), ``eval.png`` (evaluation metrics against the
step, with ``<key>_lo`` / ``<key>_hi`` drawn as an interval band) and ``summary.md``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from sparring.storage.bounded import (
    MAX_CONFIG_BYTES,
    FileLimitError,
    check_depth,
    read_text_bounded,
)
from sparring.storage.metrics_file import read_metrics

log = logging.getLogger(__name__)

PREFERRED = ("reward", "loss", "policy_loss", "kl", "entropy", "clip_frac", "approx_kl",
             "grad_norm", "value_loss", "adv_mean", "adv_std", "invalid_rate",
             "response_length", "episode_length", "lr")
TIMING = ("time/", "throughput/")
SKIP = ("step", "episodes", "optimizer_steps", "total_skipped_updates")


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], float(r[key])) for r in rows if key in r and _num(r[key])]
    return [p[0] for p in pts], [p[1] for p in pts]


def metric_keys(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[str], list[str]]:
    seen: dict[str, None] = {}
    for r in rows:
        for k, v in r.items():
            if _num(v) and k not in SKIP:
                seen.setdefault(k, None)
    allk = list(seen)
    evals = [k for k in allk if k.startswith("eval/") and not k.endswith(("_lo", "_hi", "/games"))]
    timing = [k for k in allk if k.startswith(TIMING)]
    rest = [k for k in allk if not k.startswith(("eval/", *TIMING))]
    train = [k for k in PREFERRED if k in rest] + [k for k in rest if k not in PREFERRED]
    return train, timing, evals


def _smooth(ys: list[float]) -> list[float]:
    """Debiased exponential moving average (as TensorBoard draws it), rate ~ 5 / len."""
    alpha = min(max(5 / max(len(ys), 1), 0.02), 0.3)
    out, m, w = [], 0.0, 0.0
    for y in ys:
        if math.isfinite(y):
            m, w = (1 - alpha) * m + alpha * y, (1 - alpha) * w + alpha
        out.append(m / w if w else y)
    return out


def _grid(rows, keys: list[str], path: Path, title: str, bands: bool = False) -> Path | None:
    if not keys:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(keys))
    nrow = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(nrow, cols, figsize=(4.2 * cols, 2.8 * nrow), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        xs, ys = series(rows, key)
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, lw=1, alpha=0.5 if not bands else 1)
        if not bands and len(xs) >= 20:
            ax.plot(xs, _smooth(ys), lw=2)
        if bands:
            lo, hi = series(rows, key + "_lo"), series(rows, key + "_hi")
            if lo[0] and lo[0] == hi[0]:
                ax.fill_between(lo[0], lo[1], hi[1], alpha=0.25)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def summary_table(rows, keys: list[str]) -> list[str]:
    lines = ["| metric | first | last | min | max |", "|---|---|---|---|---|"]
    for k in keys:
        _, ys = series(rows, k)
        fin = [y for y in ys if math.isfinite(y)]
        if not ys:
            continue
        lines.append(f"| {k} | {_fmt(ys[0])} | {_fmt(ys[-1])} | "
                     f"{_fmt(min(fin) if fin else None)} | {_fmt(max(fin) if fin else None)} |")
    return lines


def eval_point(rows, key: str, which: int) -> tuple[int, float, Any, Any]:
    """(step, value, lo, hi) of the ``which``-th logged value of ``key`` (0 first, -1 last)."""
    xs, ys = series(rows, key)
    step = xs[which]
    row = next(r for r in rows if r["step"] == step and key in r)
    return step, ys[which], row.get(key + "_lo"), row.get(key + "_hi")


def format_point(value: float, lo: Any, hi: Any) -> str:
    ci = f" [{_fmt(lo)}, {_fmt(hi)}]" if _num(lo) and _num(hi) else ""
    return f"{_fmt(value)}{ci}"


def _interval(rows, key: str, which: int) -> str:
    step, value, lo, hi = eval_point(rows, key, which)
    return f"{format_point(value, lo, hi)} (step {step})"


def _read_config(path: Path) -> dict[str, Any] | None:
    """The run's config as plain data (never imported or validated: a report reads it for
    its headline only); None, with a warning, when it is unreadable."""
    if not path.exists():
        return None
    try:
        text = read_text_bounded(path, MAX_CONFIG_BYTES, "config file", errors="replace")
        cfg = yaml.safe_load(text)
        check_depth(cfg)
    except FileLimitError as e:
        log.warning("%s; the report leaves out its headline", e if str(path) in str(e)
                    else f"{path}: {e}")
        return None
    except RecursionError:
        log.warning("%s: nested too deeply; the report leaves out its headline", path)
        return None
    except yaml.YAMLError as e:
        log.warning("%s is not valid YAML (%s); the report leaves out its headline", path,
                    str(e).splitlines()[0])
        return None
    if not isinstance(cfg, dict):
        log.warning("%s holds no config mapping; the report leaves out its headline", path)
        return None
    return cfg


def _get(data: Any, *keys: str) -> Any:
    """``data[k1][k2]...``, None where a level is missing or not a mapping."""
    for k in keys:
        data = data.get(k) if isinstance(data, dict) else None
    return data


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write plots and ``summary.md`` for the run in ``run_dir``; returns the summary path."""
    run = Path(run_dir)
    rows = [r for r in read_metrics(run) if _num(r.get("step"))]
    if not rows:
        raise FileNotFoundError(f"{run} has no metrics.jsonl rows to report on")
    out = Path(out_dir) if out_dir is not None else run / "report"
    out.mkdir(parents=True, exist_ok=True)
    train_keys, timing, evals = metric_keys(rows)
    images = [p for p in (
        _grid(rows, train_keys, out / "training.png", f"{run.name}: training"),
        _grid(rows, evals, out / "eval.png", f"{run.name}: evaluation", bands=True),
        _grid(rows, timing, out / "timing.png", f"{run.name}: time and throughput"),
    ) if p is not None]
    md = [f"# Run report: {run.name}", ""]
    cfg = _read_config(run / "config.yaml")
    if cfg is not None:
        envs = cfg.get("envs") if isinstance(cfg.get("envs"), list) else []
        names = ", ".join(str(_get(e, "name") or "?") for e in envs) or "-"
        md += [f"- estimator: `{_get(cfg, 'algorithm', 'estimator')}`, objective: "
               f"`{_get(cfg, 'algorithm', 'objective')}`, aggregation: "
               f"`{_get(cfg, 'algorithm', 'aggregation')}`, KL: "
               f"{_get(cfg, 'algorithm', 'kl', 'coef')} "
               f"({_get(cfg, 'algorithm', 'kl', 'reference')})",
               f"- envs: {names}; steps: {_get(cfg, 'train', 'steps')}; "
               f"model: `{_get(cfg, 'model', 'name')}`", ""]
    last = max(r["step"] for r in rows)
    md += [f"Steps logged: {last}.", ""]
    if evals:
        md += ["## Evaluation", "", "| metric | start | end |", "|---|---|---|"]
        md += [f"| {k} | {_interval(rows, k, 0)} | {_interval(rows, k, -1)} |" for k in evals]
        md += [""]
    md += ["## Training metrics", "", *summary_table(rows, train_keys), ""]
    if timing:
        md += ["## Time and throughput", "", *summary_table(rows, timing), ""]
    md += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in images] + [""]
    path = out / "summary.md"
    path.write_text("\n".join(md), encoding="utf-8")
    return path
