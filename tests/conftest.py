import os

import pytest
import torch

# The device of the tests that take the `device` fixture (learner, sampler, loop, the
# catalogue on a device): the CPU unless SPARRING_TEST_DEVICE names another, e.g.
#   SPARRING_TEST_DEVICE=cuda pytest tests/test_on_device.py tests/test_train_learner.py
# (bench/gpu.py runs that selection on a GPU).
TEST_DEVICE = os.environ.get("SPARRING_TEST_DEVICE", "cpu")

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


def pytest_configure(config):
    try:
        torch.empty(0, device=TEST_DEVICE)
    except (RuntimeError, AssertionError) as e:  # e.g. cuda without a GPU or a CUDA torch
        raise pytest.UsageError(f"SPARRING_TEST_DEVICE={TEST_DEVICE!r} is not usable "
                                f"here: {e}") from e


@pytest.fixture
def device() -> torch.device:
    """The device under test (SPARRING_TEST_DEVICE, default the CPU)."""
    return torch.device(TEST_DEVICE)
