"""Listed openings: the start positions a training run's episodes may begin from, as move
sequences in a text file (the ``openings`` start of ``envs[].starts``; played by
`sparring.envs.wrappers.RandomOpening`).

The file holds one opening per line, its moves in the env's action names separated by
spaces (``5 1 9`` is X to the centre, O to 1, X to 9 in tic-tac-toe); ``#`` starts a
comment, and blank lines are skipped. A relative path is looked up in the working
directory, then in the Sparring checkout (where the shipped lists live, under
``configs/openings/``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from sparring.storage.bounded import MAX_OPENINGS_BYTES, read_text_bounded

_CHECKOUT = Path(__file__).resolve().parents[3]


def openings_path(path: str | Path) -> Path:
    """The file ``path`` names (module docstring); FileNotFoundError naming where it
    looked."""
    p = Path(path)
    tried = [p] if p.is_absolute() else [p, _CHECKOUT / p]
    for cand in tried:
        if cand.is_file():
            return cand.resolve()
    raise FileNotFoundError(f"no openings file {str(path)!r} (looked in "
                            f"{', '.join(str(c.parent.resolve()) for c in tried)})")


def parse_openings(text: str) -> tuple[tuple[str, ...], ...]:
    """The openings of a file's ``text``: per line, its moves (comments and blank lines
    dropped). ValueError when there is none."""
    out = []
    for line in text.splitlines():
        moves = line.split("#", 1)[0].split()
        if moves:
            out.append(tuple(moves))
    if not out:
        raise ValueError("the openings file lists no opening (one per line, moves separated "
                         "by spaces)")
    return tuple(out)


@lru_cache(maxsize=8)
def _read(resolved: Path, mtime_ns: int) -> tuple[tuple[str, ...], ...]:
    return parse_openings(read_text_bounded(resolved, MAX_OPENINGS_BYTES, "openings file"))


def read_openings(path: str | Path) -> tuple[tuple[str, ...], ...]:
    """The openings in file ``path`` (read once while the file is unchanged: episodes build
    their env often)."""
    p = openings_path(path)
    return _read(p, p.stat().st_mtime_ns)
