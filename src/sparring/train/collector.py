"""Python's cyclic garbage collector while a run trains.

Everything a run's process builds before its first step (the model, the tokenizer, the
imported libraries and their caches: hundreds of thousands of objects) lives to the
run's end, and each collection of the oldest generation walks all of it again.
`startup_objects_frozen` collects once and then sets those objects aside
(`gc.freeze`) for the run's steps, so the collector walks only what the steps make, and
hands them back (`gc.unfreeze`) when the run returns or fails, so a caller that goes on in
the same process has its garbage collected as before. Nothing a step computes changes.
`gc.freeze` does not nest: objects a caller froze before the run are handed back too,
which costs that caller collector time, never correctness.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def startup_objects_frozen() -> Iterator[None]:
    """Within: every object alive on entry is out of the cyclic collector's passes."""
    gc.collect()  # what is already garbage is freed here, not kept aside
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


__all__ = ["startup_objects_frozen"]
