"""``train.deterministic``: torch's deterministic kernels, for runs that repeat bit for bit
with several threads or on a GPU.

Two runs of one config and seed need not agree bit for bit once torch runs two or more
threads, or a GPU: a kernel may sum in an order set by thread timing or atomics. The one
met on a CPU so far (a gather's backward in the shared-prompt path) is fixed at its source
(docs/reliability.md); this switch is for the others.
``torch.use_deterministic_algorithms(True, warn_only=True)`` makes torch pick an ordered
kernel wherever it has one and warn, once per op, where it has none; cuBLAS also needs
``CUBLAS_WORKSPACE_CONFIG`` before its first handle, so it is set here unless the user set
it. What it costs is measured by `bench/determinism.py`.
"""

from __future__ import annotations

import os

import torch

# cuBLAS: a fixed workspace per stream, so its reductions are ordered (torch's reproducibility notes)
CUBLAS_WORKSPACE = ":4096:8"


def use_deterministic_kernels(enabled: bool) -> None:
    """With ``enabled``: torch's deterministic kernels for the rest of this process
    (warning, not failing, at an op that has none). Without: leaves torch as it is, so a
    setting the user made in their own script stands."""
    if not enabled:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True, warn_only=True)


__all__ = ["CUBLAS_WORKSPACE", "use_deterministic_kernels"]
