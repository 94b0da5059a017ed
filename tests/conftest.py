
import pytest
import torch

# One policy for torch threads: every test runs with one (tiny models gain nothing from a
# second thread, and a run compared bit for bit with another process, a Ray worker or a
# resumed run must use the same count: tests/train_resume_job.py and the workers pin one too).
# Set here, before any test or module fixture, and put back after any test that changes it.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.fixture
def train_doubles():
    """The trainer tests' test-only estimator/objective entries (tests/train_helpers.py)."""
    from tests import train_helpers as th

    th.register()
    yield
    th.unregister()
