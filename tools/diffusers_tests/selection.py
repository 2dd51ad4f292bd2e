"""Which of diffusers' test files run, and the family each belongs to."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

# Paths under diffusers' tests/ folder, as globs (fnmatch: `*` crosses folders).
MODEL_GLOBS = (
    "models/transformers/test_*.py",
    "models/unets/test_*.py",
    "models/autoencoders/test_*.py",
    "models/controlnets/test_*.py",
    "models/test_attention_processor.py",  # diffusers' Attention options, inside models too
    "models/test_layers_utils.py",  # Transformer2DModel and attention blocks on their own
)
PIPELINE_GLOBS = ("pipelines/*/test_*.py", "pipelines/test_*.py")
DEFAULT_GLOBS = MODEL_GLOBS + PIPELINE_GLOBS

_MODEL_PREFIXES = ("test_models_transformer_", "test_models_", "test_")


def select_files(tests_dir: Path, globs: tuple[str, ...] | list[str] = DEFAULT_GLOBS) -> list[str]:
    """Test files under ``tests_dir`` matching any of ``globs`` (relative paths, e.g.
    ``models/transformers/test_models_transformer_flux.py``), sorted, models first."""
    found = set()
    for path in tests_dir.rglob("test_*.py"):
        rel = path.relative_to(tests_dir).as_posix()
        if any(fnmatch.fnmatch(rel, g) for g in globs):
            found.add(rel)
    return sorted(found, key=lambda rel: (not rel.startswith("models/"), rel))


def kind_of(rel: str) -> str:
    return "models" if rel.startswith("models/") else "pipelines"


def family_of(rel: str) -> str:
    """The model a test file is about: ``models/transformers/test_models_transformer_flux.py``
    -> ``flux``, ``models/unets/test_models_unet_2d_condition.py`` -> ``unet_2d_condition``,
    ``models/autoencoders/test_models_autoencoder_kl.py`` -> ``autoencoder_kl``; a pipeline
    test by its folder: ``pipelines/flux/test_pipeline_flux_img2img.py`` -> ``flux``
    (``pipelines/test_pipelines.py`` -> ``pipelines (common)``)."""
    parts = rel.split("/")
    if parts[0] == "pipelines":
        return parts[1] if len(parts) > 2 else "pipelines (common)"
    name = re.sub(r"\.py$", "", parts[-1])
    for prefix in _MODEL_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return name


def file_of(nodeid: str) -> str:
    """``tests/models/x/test_y.py::Class::test`` -> ``models/x/test_y.py``."""
    return nodeid.split("::", 1)[0].removeprefix("tests/")
