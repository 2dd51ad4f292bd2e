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
    from _interpreter_rounding import install  # noqa: E402

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


def _seed():
    """A fresh seed each run (random data, never zeros), printed so that a failure
    reproduces: ATTNKIT_TEST_SEED=<seed> pytest ... runs with that one instead."""
    s = int(os.environ.get("ATTNKIT_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    torch.manual_seed(s)
    print(f"seed={s}")
    return s


@pytest.fixture(scope="module")
def module_seed():
    """The seed fixture for module-scoped fixtures that draw data once for many tests."""
    return _seed()


if REPEAT > 1:
    seed = pytest.fixture(params=range(REPEAT), ids=lambda i: f"draw{i}", name="seed")(
        lambda request: _seed()
    )
else:
    seed = pytest.fixture(name="seed")(_seed)
