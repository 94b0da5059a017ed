import os

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def one_torch_thread():
    """Tiny models: a second thread only adds contention. Restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def train_doubles(one_torch_thread):
    """The trainer tests' test-only estimator/objective entries (tests/train_helpers.py)."""
    from tests import train_helpers as th

    th.register()
    yield
    th.unregister()
