"""The kernel tests watch the launcher (which tile, which kernel, which arguments:
launcher.recording()): each starts without launch plans, so that its first call of a
signature builds one."""

import pytest


@pytest.fixture(autouse=True)
def _fresh_launch_plans():
    try:
        from attnkit.kernels import launcher
    except ImportError:  # no triton: the tests that need it skip themselves
        yield
        return
    launcher.clear_plans()
    yield
    launcher.clear_plans()
