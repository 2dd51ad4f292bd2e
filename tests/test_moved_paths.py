"""The module paths attnkit had before attnkit.choose and attnkit.diffusers still import,
with every public name they had, and a processor pickled by that layout still loads."""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path

import pytest
import torch

import attnkit
from attnkit import moved_paths
from attnkit.testing import assert_close_to_reference, make_qkv

# attnkit.auto(), auto(order=("vanilla", "sdpa")), SDPAProcessor() and VanillaProcessor(),
# pickled by attnkit at 741c76e (attnkit.chooser, attnkit.processor, attnkit.backends.*).
OLD_PICKLE = Path(__file__).parent / "data" / "processors-0.1.0-741c76e.pkl"


@pytest.mark.parametrize("old", sorted(moved_paths.MOVED))
def test_every_old_name_imports_from_its_old_path(old):
    module = importlib.import_module(old)
    for home, names in moved_paths.MOVED[old].items():
        new = importlib.import_module(home)
        for name in names:
            assert getattr(module, name) is getattr(new, name), f"{old}.{name}"


def test_the_old_paths_leave_attnkit_processor_and_apply_the_functions():
    import attnkit.apply  # noqa: F401 - the old module path, imported on purpose
    import attnkit.processor  # noqa: F401

    assert callable(attnkit.apply) and attnkit.apply.__name__ == "apply"
    assert callable(attnkit.processor) and attnkit.processor.__name__ == "processor"
    from attnkit.chooser import AutoProcessor
    from attnkit.routes import sdpa_mask

    assert AutoProcessor is attnkit.AutoProcessor and callable(sdpa_mask)


def test_processors_pickled_by_the_old_layout_load_and_run(seed):
    with open(OLD_PICKLE, "rb") as f:
        loaded = pickle.load(f)
    assert type(loaded["auto"]) is attnkit.AutoProcessor
    assert type(loaded["sdpa"]) is attnkit.SDPAProcessor and type(loaded["vanilla"]) is attnkit.VanillaProcessor
    assert loaded["auto_ordered"].chooser.order[:2] == ("vanilla", "sdpa")
    q, k, v = make_qkv(1, 2, 9, 11, 16, torch.float32)
    for name in ("auto", "auto_ordered", "sdpa", "vanilla"):
        out = loaded[name].chooser.attention(None, q, k, v, None, 16**-0.5, False)
        assert_close_to_reference(out, q, k, v, None)
