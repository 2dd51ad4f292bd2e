"""Attention-kernel microbenchmarks over Stable Diffusion's shapes, per backend.

    pytest bench/ --benchmark-only                       # CUDA: full shapes; CPU: CPU-sized
    pytest bench/ --benchmark-only -k "sd15_self and fwd"
    pytest bench/ --benchmark-only --benchmark-json=kernels.json

Each benchmark calls one attnkit backend's ``forward(q, k, v)`` on (B, H, M, D) tensors
(random, never zeros) and, for "fwd+bwd", the backward too. TFLOP/s is in each result's
extra_info, from attnkit.kernels.limits.attention_flops (which imports without triton).
A backend that cannot serve a shape on this machine is skipped with its own reasons
(the same words `attnkit info` prints).

On a CPU the shapes are cut to at most CPU_TOKENS query and key tokens (named
"...@cpu" in the ids) so the whole file runs in a minute or two; ATTNKIT_BENCH_FULL=1
keeps the full shapes. ATTNKIT_BENCH_ROUNDS sets the timed rounds (default 20 on CUDA,
5 on CPU).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

from attnkit.backends import AttentionCall, DeviceInfo, get_backend
from attnkit.kernels.limits import attention_flops

HAS_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
DTYPE = torch.float16 if HAS_CUDA else torch.float32
FULL = HAS_CUDA or os.environ.get("ATTNKIT_BENCH_FULL", "0") not in ("", "0")
CPU_TOKENS = 256
ROUNDS = int(os.environ.get("ATTNKIT_BENCH_ROUNDS", "20" if HAS_CUDA else "5"))


@dataclass(frozen=True)
class Shape:
    name: str
    B: int
    H: int
    M: int
    N: int
    D: int
    what: str

    def sized(self) -> "Shape":
        if FULL:
            return self
        cut = lambda n: n if n <= CPU_TOKENS else CPU_TOKENS  # noqa: E731
        return Shape(self.name + "@cpu", self.B, self.H, cut(self.M), cut(self.N), self.D, self.what)


# Stable Diffusion's attention calls (batch 2: classifier-free guidance).
SHAPES = [
    Shape("sd15_self_4096_d40", 2, 8, 4096, 4096, 40, "SD1.5 512x512, 64x64 latents: self-attention"),
    Shape("sd15_cross_4096x77_d40", 2, 8, 4096, 77, 40, "SD1.5 512x512: cross-attention to 77 text tokens"),
    Shape("sd15_self_1024_d80", 2, 8, 1024, 1024, 80, "SD1.5 512x512, 32x32 level"),
    Shape("sd15_self_256_d160", 2, 8, 256, 256, 160, "SD1.5 512x512, 16x16 level"),
    Shape("sdxl_self_4096_d64", 2, 10, 4096, 4096, 64, "SDXL 1024x1024, 64x64 level (640 channels)"),
    Shape("sdxl_self_1024_d64", 2, 20, 1024, 1024, 64, "SDXL 1024x1024, 32x32 level (1280 channels)"),
    Shape("vae_mid_4096_d512", 1, 1, 4096, 4096, 512, "VAE mid-block at 512x512: 1 head of 512"),
]

# attnkit backend name and options, by benchmark id.
BACKENDS = {
    "vanilla": ("vanilla", {}),
    "sliced": ("sliced", {}),
    "sdpa": ("sdpa", {}),
    "sdpa_flash": ("sdpa", {"kernel": "flash"}),
    "sdpa_efficient": ("sdpa", {"kernel": "efficient"}),
    "sdpa_math": ("sdpa", {"kernel": "math"}),
    "sdpa_cudnn": ("sdpa", {"kernel": "cudnn"}),
    "xformers": ("xformers", {}),
    "flash_attn": ("flash_attn", {}),
    "triton": ("triton", {}),
}
MODES = ["fwd", "fwd+bwd"]


def _backend_or_skip(backend_id: str, shape: Shape, backward: bool):
    name, options = BACKENDS[backend_id]
    if name == "triton" and DEVICE.type != "cuda":
        pytest.skip("triton: CUDA only here (its CPU interpreter is for debugging, not timing)")
    try:
        backend = get_backend(name, **options)
    except (ImportError, ValueError) as exc:
        pytest.skip(f"{backend_id}: {exc}")
    call = AttentionCall(
        device=DeviceInfo.of(DEVICE),
        dtype=DTYPE,
        head_dim=shape.D,
        q_len=shape.M,
        kv_len=shape.N,
        batch=shape.B,
        heads=shape.H,
        requires_grad=backward,
    )
    reasons = backend.not_supported_reasons(call)
    if reasons:
        pytest.skip(f"{backend_id}: " + "; ".join(reasons))
    return backend


def _inputs(shape: Shape, backward: bool):
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(n):
        t = torch.randn(shape.B, shape.H, n, shape.D, generator=gen).to(DEVICE, DTYPE)
        return t.requires_grad_(backward)

    return rand(shape.M), rand(shape.N), rand(shape.N)


def _sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend_id", list(BACKENDS))
@pytest.mark.parametrize("shape", [s.sized() for s in SHAPES], ids=lambda s: s.name)
def test_attention(benchmark, shape: Shape, backend_id: str, mode: str):
    backward = mode == "fwd+bwd"
    backend = _backend_or_skip(backend_id, shape, backward)
    q, k, v = _inputs(shape, backward)
    scale = shape.D**-0.5
    grad = torch.randn(shape.B, shape.H, shape.M, shape.D, generator=torch.Generator().manual_seed(1)).to(DEVICE, DTYPE)

    if backward:

        def fn():
            q.grad = k.grad = v.grad = None
            out = backend.forward(q, k, v, None, scale)
            out.backward(grad)
            _sync()
            return out
    else:

        def fn():
            with torch.inference_mode():
                out = backend.forward(q, k, v, None, scale)
            _sync()
            return out

    try:
        out = fn()  # first call: compilation, autotuning, allocator warm-up
    except torch.cuda.OutOfMemoryError as exc:  # e.g. vanilla's full score matrix
        pytest.skip(f"{backend_id}: out of memory ({str(exc).splitlines()[0][:120]})")
    assert out.shape == (shape.B, shape.H, shape.M, shape.D)
    assert torch.isfinite(out).all()

    flops = attention_flops(shape.B, shape.H, shape.M, shape.N, shape.D)
    if backward:
        flops += attention_flops(shape.B, shape.H, shape.M, shape.N, shape.D, backward=True)
    benchmark.group = f"{shape.name} {mode}"
    benchmark.extra_info.update(
        {
            "shape": {"B": shape.B, "H": shape.H, "M": shape.M, "N": shape.N, "D": shape.D},
            "what": shape.what,
            "backend": backend_id,
            "backend_repr": repr(backend),
            "mode": mode,
            "dtype": str(DTYPE).replace("torch.", ""),
            "device": torch.cuda.get_device_name() if HAS_CUDA else "cpu",
            "flops": flops,
        }
    )
    benchmark.pedantic(fn, rounds=ROUNDS, warmup_rounds=1 if DEVICE.type == "cpu" else 3, iterations=1)
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        median = stats.stats.median
        benchmark.extra_info["tflops"] = flops / median / 1e12 if median > 0 else None
        benchmark.extra_info["median_ms"] = median * 1e3
