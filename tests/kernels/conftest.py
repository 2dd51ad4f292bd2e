"""The kernel tests spy on the launcher (which tile, which kernel, which arguments):
each starts without launch plans, so that its first call of a signature builds one."""

import pytest


@pytest.fixture(autouse=True)
def _fresh_launch_plans():
    try:
        from attnkit.kernels.flash import launch
    except ImportError:  # no triton: the tests that need it skip themselves
        yield
        return
    launch.clear_plans()
    yield
    launch.clear_plans()
