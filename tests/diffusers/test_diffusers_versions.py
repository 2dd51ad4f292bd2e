"""attnkit's diffusers backend on the oldest diffusers it supports (0.35), besides the
pinned one every other test runs: the private registry it plugs into is checked there
too, and a Flux model served through dispatch_attention_fn equals its stock output.

diffusers 0.35.0 is installed (without dependencies) into a temporary folder placed
first on the path of a child process; everything else comes from this environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

OLDEST = "0.35.0"

CHILD = r"""
import torch, warnings
warnings.filterwarnings("ignore")
import diffusers, attnkit
from attnkit.diffusers import backend as diffusers_backend
assert diffusers.__version__ == VERSION, diffusers.__version__
assert diffusers_backend.PROBLEM is None, diffusers_backend.PROBLEM
from diffusers import FluxTransformer2DModel
torch.manual_seed(0)
m = FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                           num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=8, axes_dims_rope=(4, 6, 6))
for p in m.parameters():
    torch.nn.init.normal_(p, std=0.2)
kw = dict(hidden_states=torch.randn(1, 16, 4), encoder_hidden_states=torch.randn(1, 6, 16),
          pooled_projections=torch.randn(1, 8), timestep=torch.rand(1), img_ids=torch.randn(16, 3),
          txt_ids=torch.randn(6, 3), return_dict=False)
with torch.no_grad():
    ref = m(**kw)[0]
    applied = attnkit.apply(m, attnkit.processor("vanilla"))
    out = m(**kw)[0]
kinds = {r.kind for r in applied.routes.values()}
assert kinds == {"dispatch"}, applied.explain()
err = ((out - ref).norm() / ref.norm()).item()
assert err < 1e-5, err
print("ok", err)
"""


def test_the_oldest_supported_diffusers(tmp_path):
    target = tmp_path / "diffusers-old"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), f"diffusers=={OLDEST}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if pip.returncode != 0:
        pytest.skip(f"could not install diffusers=={OLDEST} from PyPI here: {pip.stderr.strip()[-300:]}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(Path(__file__).resolve().parents[2])]))
    run = subprocess.run(
        [sys.executable, "-c", f"VERSION = {OLDEST!r}\n" + CHILD], capture_output=True, text=True, timeout=300, env=env
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("ok")
