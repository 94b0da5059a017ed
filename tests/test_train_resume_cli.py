"""The product path: `sparring train` (real arena, bots, opponent league) killed with
SIGKILL mid-run and resumed with `--resume` logs exactly the metrics of an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STEPS = 8
ARGS = ["configs/default.yaml", "model.options={hidden_size: 32, num_layers: 1, num_heads: 2, "
        "num_kv_heads: 2, intermediate_size: 64}", "rollout.episodes_per_step=24",
        "envs.0.group_size=4", "league.every=2", f"train.steps={STEPS}", "train.epochs=1",
        "checkpoint.every=2", "eval.every=3", "eval.games=8", "logging.progress=false"]
ROOT = Path(__file__).parents[1]
VOLATILE = ("time/", "throughput/")


def _cmd(*extra):
    return [sys.executable, "-m", "sparring", "train", *extra]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}


def _metrics(run):
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def test_sigkill_then_resume_from_the_cli_matches_an_uninterrupted_run(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(_cmd(*ARGS, f"train.run_dir={full}"), cwd=ROOT, env=_env(), check=True,
                   capture_output=True, timeout=300)
    proc = subprocess.Popen(_cmd(*ARGS, f"train.run_dir={killed}"), cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = killed / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline:  # kill once step 5 is logged (checkpoints at 2 and 4)
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 6:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL, "the run finished before it was killed"
    assert len(metrics.read_text().splitlines()) < STEPS + 1
    subprocess.run(_cmd("--resume", str(killed)), cwd=ROOT, env=_env(), check=True,
                   capture_output=True, timeout=300)
    want, got = _metrics(full), _metrics(killed)
    assert [r["step"] for r in got] == list(range(STEPS + 1))
    assert got == want


def test_a_relative_run_folder_moved_elsewhere_resumes_from_another_directory(tmp_path,
                                                                              monkeypatch):
    """Pool snapshot paths are stored relative to the run folder ('pool/step-000001', not
    'runs/rel/pool/step-000001'), so a relative train.run_dir resumed from another
    directory, or a moved run folder, resumes."""
    import shutil

    from sparring.cli import main
    from sparring.train.checkpoint import latest_checkpoint

    small = ["model.options={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 2, "
             "intermediate_size: 64}", "rollout.episodes_per_step=8", "envs.0.group_size=4",
             "envs.0.opponents=[pool]", "league.every=1", "train.epochs=1",
             "eval.games=2", "eval.at_start=false", "logging.progress=false",
             "checkpoint.every=1"]
    monkeypatch.chdir(tmp_path)
    assert main(["train", *small, "train.steps=2", "train.run_dir=runs/rel"]) == 0
    shutil.move("runs/rel", "moved")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["train", "--resume", "../moved", "train.steps=3"]) == 0
    run = tmp_path / "moved"
    assert [r["step"] for r in _metrics(run)] == [1, 2, 3]
    state = json.loads((latest_checkpoint(run) / "state.json").read_text())
    pool = state["state"]["user.rollouts"]["pool"]["checkpoints"]
    assert [c["path"] for c in pool] == ["pool/step-000001", "pool/step-000002"]
