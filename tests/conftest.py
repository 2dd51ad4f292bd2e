"""Shared test setup.

Triton runs on the CPU only through its interpreter, which must be switched on before
any @triton.jit function is defined: so it is set here, before attnkit is imported.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

HAS_CUDA = torch.cuda.is_available()

if os.environ.get("TRITON_INTERPRET") == "1":
    # The interpreter truncates fp32 to bf16; GPUs round to nearest (see the module).
    from tests.kernels._interpreter_rounding import install  # noqa: E402

    install()


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none is present on this machine")
    for item in items:
        # The marker, not the keywords: a parameter id that merely contains "cuda" is
        # not a CUDA-only test.
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


# ATTNKIT_TEST_REPEAT=n runs every seeded test n times, each with a fresh seed: a hunt
# for draws that a tolerance does not cover, without rerunning the whole session.
REPEAT = int(os.environ.get("ATTNKIT_TEST_REPEAT") or 1)

# One seed per session, fresh each run (random data, never zeros) unless
# ATTNKIT_TEST_SEED gives it; each test draws from a seed derived from it and the test's
# id, so that rerunning with the session seed reproduces every test's data, alone or in
# any order. The session seed is in the report header; a failing test prints both.
SESSION_SEED = int(os.environ.get("ATTNKIT_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))


def pytest_report_header(config):
    return f"attnkit test seed: {SESSION_SEED} (ATTNKIT_TEST_SEED={SESSION_SEED} reruns these draws)" + (
        f"; {REPEAT} draws per seeded test" if REPEAT > 1 else ""
    )


def pytest_terminal_summary(terminalreporter):
    # at the end too: `make test` runs with -q, which hides the header
    terminalreporter.write_line(pytest_report_header(None))


def _seed(request, draw: int = 0):
    import zlib

    test_seed = zlib.crc32(f"{SESSION_SEED}:{request.node.nodeid}:{draw}".encode()) & 0x7FFFFFFF
    torch.manual_seed(test_seed)
    print(f"seed={SESSION_SEED} (ATTNKIT_TEST_SEED={SESSION_SEED} reruns it; this test drew with {test_seed})")
    return test_seed


@pytest.fixture(scope="module")
def module_seed(request):
    """The seed fixture for module-scoped fixtures that draw data once for many tests."""
    return _seed(request)


if REPEAT > 1:
    seed = pytest.fixture(params=range(REPEAT), ids=lambda i: f"draw{i}", name="seed")(
        lambda request: _seed(request, request.param)
    )
else:
    seed = pytest.fixture(name="seed")(_seed)


@pytest.fixture
def restore_active_backend():
    """diffusers' process-wide active backend as it was before the test
    (set_attention_backend sets it too)."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    active = _AttentionBackendRegistry._active_backend
    yield
    _AttentionBackendRegistry.set_active_backend(active)
