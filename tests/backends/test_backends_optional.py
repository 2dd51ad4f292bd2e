"""The optional backends, xformers and flash_attn.

Neither runs on a CPU (xformers has no CPU operator, flash-attn has no wheel and needs
sm_80), so on CPU these tests check what the backends declare, the reasons and errors a
user sees, and the layout/padding/bias preparation each does before calling its
package (against stand-ins that enforce the package's documented input rules and compute
plain attention). The numerical parity tests run wherever CUDA and the package exist.
"""

from __future__ import annotations

import math

import pytest
import torch
from diffusers.models.attention_processor import Attention

import attnkit
from attnkit.backends import AttentionCall, BackendUnavailable, DeviceInfo, get_backend
from attnkit.backends.base import package_version
from attnkit.backends.flash_attn import FlashAttnBackend
from attnkit.backends.xformers import XFormersBackend, aligned_bias
from attnkit.testing import assert_close_to_reference, reference_attention
from tests._masks import additive

A100 = DeviceInfo("cuda", (8, 0), "NVIDIA A100")
T4 = DeviceInfo("cuda", (7, 5), "Tesla T4")
H100 = DeviceInfo("cuda", (9, 0), "NVIDIA H100")
B200 = DeviceInfo("cuda", (10, 0), "NVIDIA B200")
INSTALLED = {"xformers": "0.0.28", "flash_attn": "2.6.3", "flash_attn_3": "3.0.0"}


def described(device, dtype=torch.float16, d=64, mask="none", grad=False, packages=INSTALLED):
    return AttentionCall(device, dtype, d, q_len=256, kv_len=77, mask=mask, requires_grad=grad, packages=packages)


# -- what they declare -------------------------------------------------------------------
def test_flash_attn_declared_reasons():
    fa = get_backend("flash_attn")
    assert fa.not_supported_reasons(described(A100)) == []
    assert fa.not_supported_reasons(described(A100, torch.bfloat16, 256, grad=True)) == []
    reasons = fa.not_supported_reasons(described(T4, torch.float32, 512, "key_padding", packages={}))
    assert reasons[0] == "flash_attn is not installed"
    assert "--no-build-isolation" in fa.install_hint(described(T4, packages={}))
    assert "compute capability 7.5 < 8.0" in reasons
    assert "dtype=torch.float32 (supported: float16, bfloat16)" in reasons
    assert "head_dim=512 > 256" in reasons
    assert "mask=key_padding (supported: none)" in reasons
    assert fa.not_supported_reasons(described(DeviceInfo("cpu")))[0] == "device=cpu (supported: cuda)"


def test_flash_attn_3_declared_reasons():
    fa3 = get_backend("flash_attn", version=3)
    assert fa3.not_supported_reasons(described(H100)) == []
    assert fa3.not_supported_reasons(described(H100, packages={"flashattn-hopper": "3.0.0b1"})) == []
    assert "compute capability 8.0 < 9.0" in fa3.not_supported_reasons(described(A100))
    assert any("Hopper (9.0) only" in r for r in fa3.not_supported_reasons(described(B200)))
    assert "flash_attn_3 (FlashAttention-3) is not installed" in fa3.not_supported_reasons(described(H100, packages={}))
    assert "hopper/" in fa3.install_hint(described(H100, packages={}))
    with pytest.raises(ValueError, match="version=4"):
        FlashAttnBackend(version=4)
    assert get_backend("flash_attn", deterministic=True).capabilities.deterministic


def test_xformers_declared_reasons():
    xf = get_backend("xformers")
    for mask in ("none", "key_padding", "bias"):
        assert xf.not_supported_reasons(described(T4, torch.float32, 160, mask, grad=True)) == []
    reasons = xf.not_supported_reasons(described(DeviceInfo("cpu"), torch.float64, packages={}))
    assert reasons == [
        "xformers is not installed",
        "device=cpu (supported: cuda)",
        "dtype=torch.float64 (supported: float16, bfloat16, float32)",
    ]
    assert "compute capability 3.7 < 5.0" in xf.not_supported_reasons(described(DeviceInfo("cuda", (3, 7))))
    old = described(A100, packages={"xformers": "0.0.20"})
    assert "xformers 0.0.20 < 0.0.23" in xf.not_supported_reasons(old)
    assert "attnkit[xformers]" in xf.install_hint(old)


def test_xformers_pinned_ops_declare_their_own_limits():
    flash = XFormersBackend(op="flash")
    assert "mask=bias (supported: none)" in flash.not_supported_reasons(described(A100, mask="bias"))
    assert "compute capability 7.5 < 8.0" in flash.not_supported_reasons(described(T4))
    assert XFormersBackend(op="cutlass").not_supported_reasons(described(T4, torch.float32, mask="bias")) == []
    with pytest.raises(ValueError, match="op='fast'"):
        XFormersBackend(op="fast")


# -- the errors a user sees on this machine -----------------------------------------------
@pytest.mark.parametrize(
    "name, cls", [("xformers", attnkit.XFormersProcessor), ("flash_attn", attnkit.FlashAttnProcessor)]
)
def test_named_processor_refuses_cpu_with_its_reasons(seed, name, cls):
    attn = Attention(query_dim=32, heads=2, dim_head=16)
    attn.set_processor(attnkit.processor(name))
    assert isinstance(attn.processor, cls)
    with pytest.raises(BackendUnavailable) as err:
        attn(torch.randn(1, 8, 32))
    msg = str(err.value)
    assert f"attnkit backend {name!r} cannot serve" in msg
    assert "device=cpu (supported: cuda)" in msg
    assert "attnkit.auto()" in msg  # what to do instead
    if package_version(name) is None:
        assert f"{name} is not installed" in msg


@pytest.mark.skipif(package_version("xformers") is not None, reason="xformers is installed here")
def test_xformers_forward_without_the_package_says_how_to_install(seed):
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ImportError, match=r"attnkit\[xformers\]"):
        XFormersBackend().forward(q, q, q)


@pytest.mark.skipif(package_version("flash_attn") is not None, reason="flash_attn is installed here")
def test_flash_attn_forward_without_the_package_says_how_to_install(seed):
    q = torch.randn(1, 2, 8, 16, dtype=torch.float16)
    with pytest.raises(ImportError, match="no-build-isolation"):
        FlashAttnBackend().forward(q, q, q)


def test_flash_attn_refuses_a_mask_before_anything_else(seed):
    q = torch.randn(1, 2, 8, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="takes no attention mask"):
        FlashAttnBackend().forward(q, q, q, attn_bias=torch.zeros(1, 1, 1, 8, dtype=torch.float16))


def test_xformers_cannot_run_on_cpu_even_when_installed():
    # xformers 0.0.35 installs on CPU-only machines, but every operator refuses device=cpu:
    # the declaration says so before the package is ever imported.
    reasons = get_backend("xformers").not_supported_reasons(described(DeviceInfo("cpu")))
    assert reasons == ["device=cpu (supported: cuda)"]


# -- the preparation each does, against stand-ins of the packages' input rules -------------
def _bhmk_attention(q, k, v, bias, scale):
    """Plain attention on (B, M, H, K) tensors, in float64."""
    out = reference_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias, scale)
    return out.transpose(1, 2)


def fake_memory_efficient_attention(query, key, value, attn_bias=None, p=0.0, scale=None, op=None):
    """What xformers.ops.memory_efficient_attention checks on a tensor bias (fmha/common.py
    and cutlass.py), then plain attention."""
    b, m, h, _ = query.shape
    n = key.shape[1]
    assert query.shape[-1] == key.shape[-1] == value.shape[-1] and query.shape[-1] % 8 == 0
    for t in (query, key, value):
        assert t.stride(-1) == 1
    if attn_bias is not None:
        assert attn_bias.shape == (b, h, m, n), "xformers: bias must be (B, H, M, N)"
        assert attn_bias.dtype == query.dtype
        align = 16 // attn_bias.element_size()
        assert all(attn_bias.stride(i) % align == 0 for i in range(3)), attn_bias.stride()
        assert attn_bias.stride(-1) == 1
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    out = _bhmk_attention(query, key, value, attn_bias, scale)
    if attn_bias is not None:
        # a kernel may leave NaN in fully masked rows: the backend must clean them
        dead = torch.isneginf(attn_bias).all(-1).transpose(1, 2).unsqueeze(-1)
        out = out.masked_fill(dead, float("nan"))
    return out.to(query.dtype)


def fake_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, **kw):
    """flash_attn_func's input rules (same head dim, multiple of 8, <= 256, fp16/bf16,
    contiguous last dim), then plain attention."""
    assert q.dtype in (torch.float16, torch.bfloat16) and not causal and dropout_p == 0.0
    assert q.shape[-1] == k.shape[-1] == v.shape[-1] and q.shape[-1] % 8 == 0 and q.shape[-1] <= 256
    for t in (q, k, v):
        assert t.stride(-1) == 1
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    return _bhmk_attention(q, k, v, None, scale).to(q.dtype)


class _FakeXops:
    memory_efficient_attention = staticmethod(fake_memory_efficient_attention)


def processor_views(b, h, m, n, d, dtype, dv=None):
    dv = d if dv is None else dv
    q = torch.randn(b, m, h, d, dtype=dtype).transpose(1, 2)
    k = torch.randn(b, n, h, d, dtype=dtype).transpose(1, 2)
    v = torch.randn(b, n, h, dv, dtype=dtype).transpose(1, 2)
    return q, k, v


@pytest.mark.parametrize("mask", ["none", "key_padding", "per_head", "bias"])
@pytest.mark.parametrize("d, n", [(40, 77), (36, 77), (64, 64), (20, 5)])
def test_xformers_preparation_meets_xformers_rules(seed, monkeypatch, mask, d, n):
    import attnkit.backends.xformers as xmod

    monkeypatch.setattr(xmod, "import_xops", lambda: _FakeXops)
    b, h, m = 2, 3, 24
    dtype = torch.float32
    q, k, v = processor_views(b, h, m, n, d, dtype)
    bias = None
    if mask == "key_padding":
        keep = torch.rand(b, 1, 1, n) > 0.3
        keep[..., 0] = True
        bias = additive(keep, torch.float32)
    elif mask == "per_head":
        bias = torch.randn(1, h, 1, n)
    elif mask == "bias":
        bias = torch.randn(b, h, m, n)
        bias[:, :, 1, :] = float("-inf")
    scale = 0.3
    out = XFormersBackend().forward(q, k, v, bias, scale)
    assert out.shape == (b, h, m, d)
    assert_close_to_reference(out, q, k, v, bias, scale)


def test_aligned_bias_copies_only_unaligned_rows():
    aligned = torch.randn(2, 1, 1, 64, dtype=torch.float16)
    out = aligned_bias(aligned, 2, 8, 100, 64, torch.float16)
    assert out.shape == (2, 8, 100, 64) and out.data_ptr() == aligned.data_ptr()
    assert out.stride() == (64, 0, 0, 1)  # broadcast, never materialised
    ragged = torch.randn(2, 1, 1, 77, dtype=torch.float32)
    out = aligned_bias(ragged, 2, 8, 100, 77, torch.float16)
    assert out.shape == (2, 8, 100, 77) and out.dtype == torch.float16
    assert out.stride() == (80, 0, 0, 1)  # rows padded to a multiple of 8 keys
    assert torch.equal(out[:, 0, 0], ragged[:, 0, 0].half())


@pytest.mark.parametrize("d, dv", [(40, 40), (36, 36), (80, 80), (160, 160), (24, 40), (256, 256)])
def test_flash_attn_preparation_pads_head_dim_and_keeps_scale(seed, d, dv):
    backend = FlashAttnBackend()
    backend._func = fake_flash_attn_func
    q, k, v = processor_views(2, 2, 16, 20, d, torch.float16, dv)
    for scale in (None, 0.125):
        out = backend.forward(q, k, v, None, scale)
        assert out.shape == (2, 2, 16, dv)
        assert_close_to_reference(out, q, k, v, None, scale)


# -- numerical parity on CUDA, where the packages exist --------------------------------------
SHAPES = [(2, 8, 256, 77, 40), (2, 8, 64, 64, 80), (1, 8, 16, 16, 160), (2, 4, 100, 37, 36)]


@pytest.mark.cuda
@pytest.mark.parametrize("mask", ["none", "key_padding", "bias"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_xformers_matches_reference(seed, shape, dtype, mask):
    pytest.importorskip("xformers.ops")
    b, h, m, n, d = shape
    q, k, v = (t.cuda() for t in processor_views(b, h, m, n, d, dtype))
    bias = None
    if mask == "key_padding":
        keep = torch.rand(b, 1, 1, n, device="cuda") > 0.3
        keep[..., 0] = True
        bias = additive(keep, dtype)
    elif mask == "bias":
        bias = torch.randn(b, h, m, n, device="cuda", dtype=dtype)
        bias[:, :, 0] = -math.inf
    out = XFormersBackend().forward(q, k, v, bias, None)
    assert_close_to_reference(out, q, k, v, bias)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_flash_attn_matches_reference(seed, shape, dtype):
    pytest.importorskip("flash_attn")
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("flash_attn needs compute capability 8.0")
    b, h, m, n, d = shape
    q, k, v = (t.cuda() for t in processor_views(b, h, m, n, d, dtype))
    for scale in (None, 0.2):
        assert_close_to_reference(FlashAttnBackend().forward(q, k, v, None, scale), q, k, v, None, scale)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["xformers", "flash_attn"])
def test_gradients_match_reference_on_cuda(seed, name):
    pytest.importorskip("xformers.ops" if name == "xformers" else "flash_attn")
    if name == "flash_attn" and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("flash_attn needs compute capability 8.0")
    q, k, v = (t.cuda().requires_grad_() for t in processor_views(2, 4, 64, 48, 40, torch.float16))
    out = get_backend(name).forward(q, k, v)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(reference_attention(q, k, v), (q, k, v), grad.double())
    for g, w in zip(got, want):
        rel = ((g.double() - w).norm() / w.norm()).item()
        assert rel < 1e-2, rel
