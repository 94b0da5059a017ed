"""Bounded reads of files Sparring did not write this run (a run folder's files, a user's
path): a regular file (not a device such as ``/dev/zero``, a fifo or a folder, followed
through links) no larger than a stated limit, opened without blocking, and JSON no deeper
than `MAX_JSON_DEPTH`. Each refusal is a `FileLimitError` naming the file and the limit.

The limits (docs/reliability.md lists them): `MAX_CONFIG_BYTES` (``config.yaml`` and
recipes), `MAX_METRICS_BYTES` and `MAX_METRICS_LINE` (``metrics.jsonl``),
`MAX_OPENINGS_BYTES` (openings files), `MAX_JSON_BYTES` (``state.json``, manifests and the
other JSON records of a run).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import IO, Any

MAX_CONFIG_BYTES = 1 << 20  # 1 MiB; the longest recipe is under 40 KiB
MAX_METRICS_BYTES = 1 << 30  # 1 GiB; about 100,000 steps of a few KiB each
MAX_METRICS_LINE = 1 << 20  # 1 MiB; one step's row is a few KiB
MAX_OPENINGS_BYTES = 16 << 20  # 16 MiB
MAX_JSON_BYTES = 64 << 20  # 64 MiB; a checkpoint's state.json is tens of KiB
MAX_JSON_DEPTH = 100  # nesting of JSON arrays and objects; Sparring writes fewer than 10


def _a(what: str) -> str:
    return f"{'an' if what[:1] in 'aeiou' else 'a'} {what}"


class FileLimitError(ValueError):
    """A file that is not a regular file, is larger than its limit or nests too deeply."""


def open_bounded(path: str | Path, limit: int, what: str) -> IO[bytes]:
    """``path`` opened for reading in binary, after checking that it is a regular file of
    at most ``limit`` bytes (``what``: what the file is, for the message). A missing file
    is the usual `FileNotFoundError`."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileLimitError(f"{path}: not a regular file (a device, fifo or folder); "
                                 f"{_a(what)} must be one")
        if st.st_size > limit:
            raise FileLimitError(f"{path}: {st.st_size:,} bytes, more than the {limit:,} "
                                 f"{_a(what)} may have")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes_bounded(path: str | Path, limit: int, what: str) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (`open_bounded`;
    a file that grows past the limit while it is read is refused too)."""
    with open_bounded(path, limit, what) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileLimitError(f"{path}: more than the {limit:,} bytes {_a(what)} may have")
    return data


def read_text_bounded(path: str | Path, limit: int, what: str,
                      errors: str = "strict") -> str:
    """The UTF-8 text of ``path`` (`read_bytes_bounded`); ``errors`` as for ``bytes.decode``
    (strict: a `UnicodeDecodeError` for bytes that are not UTF-8)."""
    return read_bytes_bounded(path, limit, what).decode("utf-8", errors)


def text_lines_bounded(f: IO[bytes], path: str | Path, line_limit: int, what: str
                       ) -> list[tuple[int, str]]:
    """``(line number, text)`` of each line of the open file ``f`` (UTF-8, undecodable
    bytes replaced); a line longer than ``line_limit`` bytes is a `FileLimitError`."""
    out = []
    for n, raw in enumerate(iter(lambda: f.readline(line_limit + 1), b""), 1):
        if len(raw) > line_limit and not raw.endswith(b"\n"):
            raise FileLimitError(f"{path}: line {n} is longer than the {line_limit:,} bytes "
                                 f"a line of {_a(what)} may have")
        out.append((n, raw.decode("utf-8", "replace")))
    return out


def check_depth(data: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """The nesting depth of ``data`` (lists and dicts), walked without recursion; a
    `FileLimitError` (no file named) past ``limit``."""
    stack, deepest = [(data, 1)], 0
    while stack:
        x, d = stack.pop()
        if isinstance(x, (dict, list)):
            if d > limit:
                raise FileLimitError(f"nested more than {limit} levels deep")
            deepest = max(deepest, d)
            stack.extend((v, d + 1) for v in (x.values() if isinstance(x, dict) else x))
    return deepest


def loads_json_bounded(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(text)``, with nesting past ``limit`` levels a `FileLimitError` (also
    where the parser itself would overflow the stack)."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise FileLimitError(f"nested more than {limit} levels deep") from None
    check_depth(data, limit)
    return data


def read_json_bounded(path: str | Path, limit: int = MAX_JSON_BYTES,
                      what: str = "JSON record") -> Any:
    """The JSON document in ``path``: a regular file of at most ``limit`` bytes, nested at
    most `MAX_JSON_DEPTH` levels. Bad JSON is a ``json.JSONDecodeError`` (a ValueError);
    too deep a `FileLimitError` naming the file."""
    raw = read_bytes_bounded(path, limit, what)
    try:
        return loads_json_bounded(raw.decode("utf-8"))
    except FileLimitError as e:
        raise FileLimitError(f"{path}: {e}; not {_a(what)}") from None
