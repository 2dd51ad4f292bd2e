"""Errors that name the value, the limit and the way out: a pinned SDPA kernel that
cannot serve a call, and ``attnkit info --model`` given something that is not a model's
config."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
from diffusers.models.attention_processor import Attention

import attnkit
from attnkit import info_model
from attnkit.__main__ import main
from attnkit.backends import BackendUnavailable, get_backend

WAY_OUT = ("SDPAProcessor()", "attnkit.auto()")


# -- a pinned SDPA kernel -------------------------------------------------------------------
def test_flash_pin_refuses_a_mask_that_needs_a_gradient_by_name():
    """torch's flash kernel gives a mask no gradient: the refusal names the pinned
    kernel, the call's shapes, dtype and mask, and what serves it instead."""
    q, k, v = (torch.randn(2, 3, 5, 8, dtype=torch.float64) for _ in range(3))
    bias = torch.zeros(2, 3, 5, 5, dtype=torch.float64, requires_grad=True)
    with pytest.raises(BackendUnavailable) as err:
        get_backend("sdpa", kernel="flash").forward(q, k, v, bias)
    text = str(err.value)
    assert "kernel='flash'" in text
    assert "q (2, 3, 5, 8)" in text and "float64" in text and "mask=bias (2, 3, 5, 5)" in text
    assert "requiring grad" in text and "gives an attention mask no gradient" in text
    assert all(w in text for w in WAY_OUT) and "kernel='math'" in text
    assert err.value.reasons == {"sdpa": [text.split(": ", 1)[1].split(". Use")[0]]}


@pytest.mark.filterwarnings("ignore:Flash attention:UserWarning")  # torch's own, on the first try
def test_no_available_kernel_under_a_pin_is_named():
    """torch's own refusal ("No available kernel") becomes an error naming the pinned
    kernel, the call, torch's reason (from its warnings) and the way out."""
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 7, 8)
    v = torch.randn(1, 2, 7, 16)  # a value head dim the flash kernel does not take
    with pytest.raises(BackendUnavailable) as err:
        get_backend("sdpa", kernel="flash").forward(q, k, v)
    text = str(err.value)
    assert "kernel='flash'" in text and "v (1, 2, 7, 16) float32 on cpu" in text and "no mask" in text
    assert "same last dimension" in text and "Value.size(-1): 16" in text
    assert "Triggered internally" not in text and ".." not in text
    assert all(w in text for w in WAY_OUT) and "kernel='math'" in text
    assert "No available kernel" in str(err.value.__cause__)
    # unpinned, torch picks a kernel that takes it
    assert get_backend("sdpa").forward(q, k, v).shape == (1, 2, 5, 16)


@pytest.mark.parametrize("kernel", ["efficient", "cudnn"])
def test_a_kernel_without_a_cpu_implementation_is_named(kernel):
    """Called directly (no processor to check first), torch says "No viable backend":
    the error names the kernel and gives the declared reason instead."""
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float16) for _ in range(3))
    with pytest.raises(
        BackendUnavailable,
        match=rf"kernel='{kernel}' cannot serve q \(1, 2, 5, 8\).* float16 "
        r"on cpu, no mask: device=cpu \(supported: cuda\)\. Use "
        r"SDPAProcessor\(\) .*attnkit\.auto\(\)",
    ):
        get_backend("sdpa", kernel=kernel).forward(q, k, v)


@pytest.mark.parametrize("kernel", ["efficient", "cudnn"])
def test_processor_refusal_names_the_pinned_kernel(kernel):
    """The processor refuses before torch runs: its message names the kernel and the
    call, and the SDPA settings that serve the call here."""
    attn = Attention(query_dim=32, heads=2, dim_head=16)
    attn.set_processor(attnkit.SDPAProcessor(kernel=kernel))
    with torch.no_grad(), pytest.raises(BackendUnavailable) as err:
        attn(torch.randn(1, 4, 32))
    text = str(err.value)
    assert f"the pinned kernel='{kernel}' cannot serve this call (cpu float32 B=1 H=2 M=4 N=4 D=16 mask=none)" in text
    assert "no pin (SDPAProcessor(): torch chooses per call), kernel='flash', kernel='math'; or attnkit.auto()" in text
    assert f"'{kernel}'" not in text.split("use no pin")[1]  # never itself as the way out
    assert len(err.value.reasons["sdpa"]) >= 2  # the declared reason(s), then the note


def test_reasons_of_an_unpinned_or_servable_call_are_unchanged():
    from attnkit.backends import AttentionCall, DeviceInfo

    cpu = AttentionCall(DeviceInfo("cpu"), torch.float32, 40)
    assert get_backend("sdpa", kernel="flash").not_supported_reasons(cpu) == []
    lse_cuda = AttentionCall(DeviceInfo("cuda", (9, 0)), torch.float16, 40, lse=True)
    assert not any("pinned" in r for r in get_backend("sdpa").not_supported_reasons(lse_cuda))
    # a call no SDPA kernel serves: only auto() is offered
    assert (
        get_backend("sdpa", kernel="math")
        .not_supported_reasons(lse_cuda)[-1]
        .endswith("no SDPA kernel serves it here: use attnkit.auto()")
    )


# -- attnkit info --model -----------------------------------------------------------------
MODEL_NAMES = (
    "sd15_unet",
    "sd15_vae",
    "sdxl_unet",
    "flux_dev_transformer",
    "sd3_medium_transformer",
    "wan21_t2v_1.3b_transformer",
)


def _info_model(capsys, value) -> tuple[int, str, str]:
    rc = main(["info", "--model", str(value)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _suggested(err: str) -> list[str]:
    return err.strip().rsplit("one of attnkit's: ", 1)[1].split(", ")


def _assert_clear(err: str, value) -> None:
    """One line, naming the value and what --model takes; no traceback."""
    assert err.startswith(f"attnkit info: --model {str(value)!r}") and err.count("\n") == 1, err
    assert "Traceback" not in err
    if "cannot build" in err:  # a model's config, with values its class does not take
        return
    assert "a folder holding config.json" in err and "sd15_unet" in err
    assert not any("scheduler" in name for name in _suggested(err)), err


def test_a_scheduler_is_not_a_model(capsys):
    rc, out, err = _info_model(capsys, "sd15_scheduler")
    assert rc == 2 and out == ""
    _assert_clear(err, "sd15_scheduler")
    assert "'sd15_scheduler' (DDIMScheduler) is a scheduler's config, which has no attention modules" in err


def test_the_command_line_says_it_without_a_traceback(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "attnkit", "info", "--model", "sd15_scheduler"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and out.stdout == ""
    _assert_clear(out.stderr, "sd15_scheduler")


def test_every_name_suggested_works_with_model(capsys):
    rc, _, err = _info_model(capsys, "no-such-model")
    assert rc == 2
    _assert_clear(err, "no-such-model")
    assert "no such file or folder, nor a config shipped with attnkit" in err
    names = _suggested(err)
    assert set(MODEL_NAMES) <= set(names) and names == info_model.shipped_models()
    for name in names:
        rc, out, err = _info_model(capsys, name)
        assert rc == 0 and err == "" and re.match(r"\w+: \d+ attention modules", out), (name, out, err)


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "make,says",
    [
        (lambda d: d / "missing" / "config.json", "no such file or folder"),
        (lambda d: d, "is a folder without config.json;"),
        (
            lambda d: _write(d, "scheduler/scheduler_config.json", "{}").parent.parent,
            "is a folder without config.json;",
        ),
        (
            lambda d: _write(d, "unet/config.json", "{}").parent.parent,
            "is a folder without config.json (its subfolders unet/ have one: give one of those)",
        ),
        (lambda d: _write(d, "configs/a.json", "{}").parent, "(it holds 1 .json file: give one's path)"),
        (lambda d: _write(d, "config.json", "not json {"), "is not a JSON file (Expecting value: line 1"),
        (lambda d: _write(d, "config.json", "[1, 2]"), "holds a JSON list, not a config"),
        (
            lambda d: _write(d, "config.json", json.dumps({"architectures": ["CLIPTextModel"]})),
            "is not a diffusers config (it names no _class_name)",
        ),
        (
            lambda d: _write(d, "config.json", json.dumps({"_class_name": "NoSuchModel2D"})),
            "names class 'NoSuchModel2D', which diffusers",
        ),
        (
            lambda d: _write(
                d,
                "model_index.json",
                json.dumps(
                    {
                        "_class_name": "StableDiffusionPipeline",
                        "unet": ["diffusers", "UNet2DConditionModel"],
                        "vae": ["diffusers", "AutoencoderKL"],
                    }
                ),
            ),
            "(StableDiffusionPipeline) is a pipeline's config (model_index.json): its models are in its subfolders "
            "(unet/, vae/), not a model's",
        ),
        (
            lambda d: _write(d, "config.json", json.dumps({"_class_name": "AutoencoderKL", "block_out_channels": 3})),
            "cannot build AutoencoderKL from it (TypeError: 'int' object is not subscriptable); check the config "
            "against that version's AutoencoderKL",
        ),
    ],
    ids=[
        "missing-path",
        "empty-folder",
        "folder-of-folders",
        "pipeline-folder",
        "folder-of-json",
        "not-json",
        "json-list",
        "transformers-config",
        "unknown-class",
        "pipeline-config",
        "unbuildable",
    ],
)
def test_what_is_not_a_model_config_is_said_in_one_line(capsys, tmp_path, make, says):
    value = make(tmp_path)
    rc, out, err = _info_model(capsys, value)
    assert rc == 2 and out == ""
    _assert_clear(err, value)
    assert says in err, err
