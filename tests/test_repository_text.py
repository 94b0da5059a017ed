"""The repository's text speaks of Sparring itself: its behaviour, versions and tests.

Every tracked text file (source, tests, configs, README.md, docs/, CHANGELOG.md, ...) is
checked for words about how the project was made rather than what it does: numbered work
sessions or issues (``session <n>``, ``issue #<n>``, a test named ``test_issue<n>_...``),
a machine lent or borrowed, absolute paths of one developer's machine (under ``/work``,
``/root``, ``/home/<name>/``, ``/Users/<name>/``), and a reading list that lives outside
the repository (a paper is cited by its title instead). ``/tmp`` is not flagged: it is
where commands and scripts put scratch files on any machine. A game's "turn 3" is
Sparring's own vocabulary and is not flagged either.

This file is scanned too: its patterns and its injected samples are written so that they
do not match themselves (a path's letter in a character class, a word split in two).
Skipped outside a git checkout."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# a machine lent or borrowed, in either order of the words
_LENT = r"(?:lent|borrowed|loaned)"
_MACHINE = r"(?:GPUs?|machines?|devices?|box(?:es)?|cards?)"

# (what it catches, the pattern); `(?<![A-Za-z])` rather than \b, so that an identifier
# such as test_issue<n>_x or run_session<n> is caught while "tissue 3" is not
PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("a numbered work session", re.compile(r"(?<![A-Za-z])[Ss]essions?[ _-]?#?\d+")),
    ("a numbered issue", re.compile(r"(?<![A-Za-z])[Ii]ssues?[ _-]?#?\d+")),
    ("a numbered defect", re.compile(r"(?<![A-Za-z])[Dd]efects?[ _-]?#?\d+")),
    ("a machine lent or borrowed", re.compile(
        rf"\b{_LENT}\s+{_MACHINE}\b|\b{_MACHINE}\s+(?:was|were|is|are)\s+{_LENT}\b",
        re.IGNORECASE)),
    ("a developer machine's path", re.compile(r"(?<![\w.~-])/(?:wor[k]|roo[t])/")),
    ("a developer machine's home", re.compile(
        r"(?<![\w.~-])/(?:hom[e]|User[s])/[A-Za-z0-9_.-]+/")),
    ("a reading list outside the repository (cite the paper)",
     re.compile(r"\bCATALOGU[E]\.md\b")),
]

BINARY_SAMPLE = 8192  # a NUL in the first bytes: not text


def offences(text: str, name: str) -> list[str]:
    """``name:line: what (the matched text)`` for every match of `PATTERNS` in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in PATTERNS:
            for match in pattern.finditer(line):
                found.append(f"{name}:{number}: {what} ({match.group(0)!r})")
    return found


def tracked_text_files() -> list[Path]:
    """The checkout's tracked files that exist (skips the test outside a git checkout)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if proc.returncode != 0 or not proc.stdout:
        pytest.skip("not a git checkout")
    files = []
    for rel in proc.stdout.decode().split("\0"):
        path = ROOT / rel
        if not rel or not path.is_file():
            continue
        files.append(path)
    return files


def read_text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:BINARY_SAMPLE]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_no_tracked_file_speaks_of_how_the_project_was_made():
    found = []
    for path in tracked_text_files():
        text = read_text(path)
        if text is not None:
            found += offences(text, str(path.relative_to(ROOT)))
    assert not found, ("text about how the project was made, not about what it does "
                       "(say what the code does now):\n" + "\n".join(found))


# the samples are split ("S" + "ession") so that this file does not match itself
CAUGHT = [
    "S" + "ession 33: the head recipe",
    "the recipe before s" + "ession 19",
    "(sinc" + "e s" + "ession 32)",
    "s" + "essions 33-34",
    "the s" + "ession-13 run",
    "I" + "ssue 16: config gaps",
    "see i" + "ssue #12",
    "def test_i" + "ssue16_invalid_configs():",
    "run_s" + "ession7 = 1",
    "D" + "efect 2: per-env options",
    "on the l" + "ent GPU",
    "the B" + "orrowed machine has no network",
    "(no GPU was l" + "ent)",
    "cd /wo" + "rk/main && make",
    "see /wo" + "rk/shared/notes.md",
    "AT-GRPO (CATA" + "LOGUE.md) reports",
    "open('/ro" + "ot/.cache/x')",
    "/ho" + "me/alice/projects/sparring",
    "/Us" + "ers/bob/code/x.py",
]
CLEAN = [
    "the game's turn 3: X plays 5",
    "a tissue 3 cm wide",
    "the session of play ends",
    "an issue with the model's format",
    "python bench/gpu.py --out /tmp/gpu_out",
    "https://example.com/work/3 and https://example.org/home/x/y",
    "~/work/notes.md",
    "Path.home() / 'runs'",
    "on a GPU machine without network",
    "the GPU was busy, so the learner ran on the CPU",
]


@pytest.mark.parametrize("line", CAUGHT)
def test_the_checker_catches_an_injected_line(line):
    text = f"first line\n{line}\nlast line\n"
    found = offences(text, "fake.py")
    assert found and all(f.startswith("fake.py:2: ") for f in found), found


@pytest.mark.parametrize("line", CLEAN)
def test_the_checker_leaves_plain_text_alone(line):
    assert offences(line, "fake.py") == []


def test_the_checker_reads_the_checkout():
    files = {p.relative_to(ROOT).as_posix() for p in tracked_text_files()}
    assert {"pyproject.toml", "src/sparring/__init__.py", "tests/conftest.py"} <= files
    assert read_text(Path(__file__)) is not None
