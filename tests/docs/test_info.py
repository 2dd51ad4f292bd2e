"""`attnkit info`: devices, versions, backends with reasons, auto()'s choices."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from attnkit import info
from attnkit.choose import policy
from attnkit.choose.policy import CANDIDATES
from attnkit.diffusers import hooks
from attnkit.testing import assert_close_to_reference, make_qkv


def test_collect_has_every_section():
    data = info.collect()
    assert data["versions"]["torch"] == torch.__version__
    for name in ("diffusers", "triton", "xformers", "flash_attn", "attnkit", "python"):
        assert name in data["versions"]
    assert data["devices"][0]["device"] == "cpu"
    assert [b["name"] for b in data["backends"]] == list(CANDIDATES)
    # the backends are judged on the primary device (a GPU where there is one): fp32 on
    # the CPU, fp16 on a GPU
    device = data["primary_device"]
    dtype = torch.float32 if device == "cpu" else torch.float16
    for b in data["backends"]:
        # what info calls available really runs here, and what it does not says why
        backend = policy.make_backend(b["name"])
        if b["available"]:
            q, k, v = make_qkv(1, 2, 8, 8, 64, dtype, device=device)
            assert_close_to_reference(backend.forward(q, k, v), q, k, v)
        else:
            assert b["reasons"], b
            with pytest.raises(Exception):
                backend.forward(*make_qkv(1, 2, 8, 8, 64, dtype, device=device))
    assert data["hardware_class"] in ("cpu", "sm_90", "sm_80", "sm_86-89", "sm_75-", "sm_100+", "rocm", "mps")
    # SD1.5's head dims, fp16 and fp32, with and without a mask, self and cross
    rows = {(r["head_dim"], r["dtype"], r["mask"]) for r in data["sd15"]}
    assert rows == {(d, t, m) for d in (40, 80, 160) for t in ("float16", "float32") for m in ("none", "key_padding")}
    for r in data["sd15"]:
        assert r["self"]["backend"] and r["cross"]["backend"]


def test_report_on_this_machine():
    text = info.report()
    assert "versions:" in text and "devices:" in text
    for name in CANDIDATES:
        assert f"\n  {name} " in text
    assert "auto() for Stable Diffusion 1.5 shapes" in text
    if not torch.cuda.is_available():
        assert "xformers     unavailable:" in text and "device=cpu (supported: cuda)" in text
        assert "sdpa         available" in text
        assert "hardware class cpu, order sdpa > sliced > vanilla" in text
        assert "triton" not in text.split("auto() for Stable Diffusion")[1]


def test_report_names_the_changes_to_diffusers():
    data = info.collect()
    assert [h["name"] for h in data["diffusers_hooks"]] == [h.name for h in hooks.HOOKS + hooks.ON_DEMAND]
    assert "changes to diffusers (attnkit/diffusers/hooks.py): 6 of 6 installed" in info.report(data)
    missing = dict(
        data,
        diffusers_hooks=[
            dict(
                h,
                installed=h["name"] != "set_attn_processor",
                problem="AttentionMixin.set_attn_processor is missing" if h["name"] == "set_attn_processor" else None,
            )
            for h in data["diffusers_hooks"]
        ],
    )
    text = info.report(missing)
    assert "5 of 6 installed" in text
    assert "  on demand: context parallel over gloo: " in text
    assert "  set_attn_processor: not installed (AttentionMixin.set_attn_processor is missing)" in text


def test_main_json(capsys):
    assert info.main(["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"versions", "devices", "backends", "sd15", "priority"} <= set(data)


def test_command_line():
    out = subprocess.run([sys.executable, "-m", "attnkit", "info"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "attnkit info" in out.stdout and "backends on" in out.stdout
