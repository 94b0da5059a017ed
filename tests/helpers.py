"""Hand-built episodes, a deadline for code that could hang, bench scripts loaded as
modules, and the CLI run in-process, shared by tests."""

import contextlib
import importlib.util
import signal
from pathlib import Path

from sparring.data import Episode, Turn


@contextlib.contextmanager
def deadline(seconds: int = 20):
    """Raise TimeoutError in the block after ``seconds`` instead of hanging (a read of
    /dev/zero or of a fifo never ends). Main thread only (SIGALRM)."""
    def expire(*_):
        raise TimeoutError(f"still running after {seconds}s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def two_seat_episode(group: int = 0, seed: int = 0, returns=(1.0, -1.0)) -> Episode:
    """Seat 0 acts at steps 0 and 2, seat 1 at step 1. Full-history prompts (prefix property)."""
    t0 = Turn(agent=0, prompt_ids=[1, 2], action_ids=[5, 6], logprobs=[-0.1, -0.2], reward=0.0,
              state_key="s0")
    t1 = Turn(agent=1, prompt_ids=[3], action_ids=[7], logprobs=[-0.3], reward=0.5, state_key="s1")
    t2 = Turn(agent=0, prompt_ids=[1, 2, 5, 6, 9], action_ids=[8, 8, 8], logprobs=[-1.0, -2.0, -3.0],
              reward=1.0, state_key="s2", done=True)
    return Episode(env="toy", seed=seed, group=group, num_agents=2, turns=[t0, t1, t2],
                   returns=list(returns))


def load_bench(name: str):
    """``bench/<name>.py`` as a module (bench scripts are not a package)."""
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cli(capsys, *args):
    """(exit code, stdout, stderr) of ``sparring ARGS`` run in this process."""
    from sparring.cli import main

    capsys.readouterr()
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line(err: str, prefix: str = "") -> str:
    """The single line of ``err`` (warnings and the run's precision line aside), checked to
    start with ``prefix`` and to be no traceback."""
    lines = [x for x in err.strip().splitlines()
             if x.strip() and not x.startswith(("warning:", "precision:", "[transformers]"))]
    assert len(lines) == 1 and lines[0].startswith(prefix), err
    assert "Traceback" not in err
    return lines[0]
