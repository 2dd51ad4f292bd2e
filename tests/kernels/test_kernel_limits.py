"""attnkit.kernels.limits: the kernels' limits, importable without triton, and the
ImportError that `import attnkit.kernels` gives without it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import attnkit.kernels.devices as devices  # the submodule form: works without triton
import attnkit.kernels.limits as limits


def _without_triton(code: str) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter where `import triton` fails as if not installed."""
    prelude = "import sys\nsys.modules['triton'] = None  # import triton -> ModuleNotFoundError\n"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120
    )


def test_limits_import_without_triton():
    res = _without_triton("""
        import attnkit.kernels.limits as lim
        from attnkit.kernels.limits import input_problems
        assert 'triton' not in sys.modules or sys.modules['triton'] is None
        print(lim.MAX_HEAD_DIM, input_problems(64))
    """)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [str(limits.MAX_HEAD_DIM), "[]"]


def test_kernels_without_triton_name_the_extra():
    res = _without_triton("""
        try:
            import attnkit.kernels
        except ImportError as e:
            print('ImportError:', e)
        else:
            print('imported')
    """)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("ImportError:"), res.stdout
    assert "pip install 'attnkit[triton]'" in res.stdout


def test_kernels_after_limits_without_triton_still_name_the_extra():
    """Once the package was imported for its limits, asking it for a kernel gives the
    same ImportError (not an AttributeError)."""
    res = _without_triton("""
        import attnkit.kernels.limits
        try:
            from attnkit.kernels import flash_attention
        except ImportError as e:
            print('ImportError:', e)
    """)
    assert res.returncode == 0, res.stderr
    assert "pip install 'attnkit[triton]'" in res.stdout, res.stdout


def test_head_dim_pieces():
    split = limits.split_head_dim
    assert split(40) == (32, 16)
    assert split(80) == (64, 16)
    assert split(160) == (128, 32)
    assert split(64) == (64, 0)
    assert split(8) == (16, 0)
    assert split(100) == (128, 0)
    assert split(256) == (256, 0)
    # FlashAttention-2/3's padded head dims for these (multiples of 32 / their list).
    fa_pad = {40: 64, 72: 96, 80: 96, 160: 192}
    for d in range(limits.MIN_HEAD_DIM, limits.MAX_HEAD_DIM + 1):
        d0, d1 = split(d)
        assert d0 + d1 >= d and 16 <= d0 <= limits.MAX_PIECE and d0 & (d0 - 1) == 0
        assert d1 == 0 or (16 <= d1 <= d0 and d1 & (d1 - 1) == 0)
        assert d0 + d1 <= max(16, 1 << (d - 1).bit_length())  # never worse than next pow2
        if d in fa_pad:
            assert limits.padding_waste(d) < (fa_pad[d] - d) / fa_pad[d]
    with pytest.raises(ValueError, match="head_dim=4 is outside"):
        split(4)


def test_attention_flops():
    flops = limits.attention_flops
    assert flops(2, 8, 4096, 77, 40) == 4 * 2 * 8 * 4096 * 77 * 40
    assert flops(1, 1, 10, 10, 64, backward=True) == 2.5 * 4 * 10 * 10 * 64
    assert flops(1, 1, 10, 10, 64, causal=True) == 0.5 * 4 * 10 * 10 * 64
    assert flops(1, 1, 10, 10, 64, backward=True, causal=True) == 2.5 * 0.5 * 4 * 10 * 10 * 64


def test_input_problems_name_limit_value_and_remedy():
    ip = limits.input_problems
    assert ip(64, batch=2, heads=8, q_len=4096, kv_len=77) == []
    too_big = limits.MAX_HEAD_DIM + 8
    (r,) = ip(too_big)
    assert r.startswith(f"head_dim={too_big} exceeds {limits.MAX_HEAD_DIM}") and "use another backend" in r
    (r,) = ip(4)
    assert r.startswith(f"head_dim=4 is below {limits.MIN_HEAD_DIM}")
    (r,) = ip(64, kv_len=0)
    assert r.startswith("kv_len=0")
    (r,) = ip(64, batch=limits.MAX_GRID_YZ + 1)
    assert f"batch={limits.MAX_GRID_YZ + 1} exceeds {limits.MAX_GRID_YZ}" in r and "split the batch" in r
    (r,) = ip(64, heads=limits.MAX_GRID_YZ + 1)
    assert "split the heads" in r
    (r,) = ip(64, v_head_dim=32)
    assert r.startswith("v head_dim=32 differs")
    assert len(ip(4, kv_len=0, batch=10**6)) == 3


def test_devices_import_without_triton():
    res = _without_triton("""
        import attnkit.kernels.devices as dev
        print(dev.target((8, 9)), dev.shared_memory_problem((8, 9), 'torch.float16', 64, ('none',), False, True))
    """)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["sm80", "None"]


def test_which_tile_lists_a_gpu_runs():
    """Ampere, Ada and consumer Blackwell (99 KiB of shared memory per block, no
    warp-group MMA) run the sm80 lists; Hopper and datacenter Blackwell the sm90 ones."""
    for cap in ((8, 0), (8, 6), (8, 7), (8, 9), (12, 0)):
        assert devices.target(cap) == "sm80", cap
    for cap in ((9, 0), (10, 0)):
        assert devices.target(cap) == "sm90", cap
    assert [devices.band(d) for d in (8, 40, 64, 80, 96, 100, 160, 256, 320, 384, 400, 512)] == [
        64,
        64,
        64,
        96,
        96,
        128,
        192,
        256,
        320,
        384,
        512,
        512,
    ]


def test_a_call_the_gpus_shared_memory_cannot_hold_is_named(monkeypatch):
    import torch

    monkeypatch.setattr(
        devices,
        "NEEDS",
        {("sm80", "dkdv", "32bit", 512, "full", False): 133_312, ("sm80", "fwd", "16bit", 96, "keypad", True): 110_000},
    )
    why = devices.shared_memory_problem((8, 9), torch.float32, 480, ("keypad", "full"), False, backward=True)
    assert why is not None
    for part in ("backward (dkdv)", "head dim 480", "133,312 B", "8.9 has 101,376 B", "ATTNKIT_BACKEND=sdpa"):
        assert part in why, (part, why)
    fwd = devices.shared_memory_problem((12, 0), torch.float16, 96, ("keypad",), True, backward=False)
    assert fwd is not None and "forward (fwd)" in fwd
    # What fits, or is not in the table: the forward alone, an A100, the other causality,
    # band, width or variant, a GPU that runs the sm90 lists, an unknown capability.
    for cap, dtype, d, variants, causal, backward in (
        ((8, 9), torch.float32, 512, ("full",), False, False),
        ((8, 0), torch.float32, 512, ("full",), False, True),
        ((8, 9), torch.float32, 512, ("full",), True, True),
        ((8, 9), torch.float32, 384, ("full",), False, True),
        ((8, 9), torch.float16, 512, ("full",), False, True),
        ((8, 9), torch.float32, 512, ("none",), False, True),
        ((9, 0), torch.float32, 512, ("full",), False, True),
        ((11, 5), torch.float32, 512, ("full",), False, True),
        (None, torch.float32, 512, ("full",), False, True),
    ):
        assert devices.shared_memory_problem(cap, dtype, d, variants, causal, backward) is None, (cap, d, causal)


def test_the_a100_only_backward_tiles_are_refused_on_99_kib_gpus_only(monkeypatch):
    """The shipped sm80 tiles that need A100's shared memory (devices.NEEDS, measured by
    the static report) refuse their calls on a GPU with 99 KiB per block, and only there,
    only for the backward, naming the kernel every such call runs and the head dims its
    tile serves."""
    import torch

    why = devices.shared_memory_problem((8, 9), torch.float16, 500, ("keypad",), True, backward=True)
    assert why is not None
    for part in ("backward (dkdv)", "head dim 500", "165,760 B", "padded head dims 385-512", "8.9 has 101,376 B"):
        assert part in why, (part, why)
    for cap, causal, backward in (((8, 9), True, False), ((8, 0), True, True), ((8, 9), False, True)):
        assert devices.shared_memory_problem(cap, torch.float16, 500, ("keypad",), causal, backward) is None
    # On a tie the kernel every call runs is named, not the bias-gradient one.
    monkeypatch.setattr(
        devices,
        "NEEDS",
        {
            ("sm80", "dkdv_dbias", "16bit", 320, "keypad", True): 110_000,
            ("sm80", "dkdv", "16bit", 320, "keypad", True): 110_000,
        },
    )
    why = devices.shared_memory_problem((8, 6), torch.bfloat16, 300, ("keypad",), True, backward=True)
    assert "backward (dkdv)" in why and "padded head dims 257-320" in why, why


def test_one_query_row_with_a_key_padding_mask_is_checked_as_the_full_bias_it_runs_as():
    """With one query row a key-padding mask keeps its query stride, and the kernels run
    it as a full bias: the Triton backend checks that variant's shared memory (16-bit
    causal dK/dV at head dims 65-96 with a full bias needs A100's)."""
    import torch

    from attnkit.backends.base import AttentionCall, DeviceInfo
    from attnkit.backends.triton import TritonBackend

    def reasons(q_len):
        call = AttentionCall(
            DeviceInfo("cuda", (8, 9)),
            torch.float16,
            96,
            q_len=q_len,
            kv_len=77,
            mask="key_padding",
            requires_grad=True,
            causal=True,
        )
        return [r for r in TritonBackend().extra_reasons(call) if "shared memory" in r]

    assert reasons(2) == []
    assert len(reasons(1)) == 1 and "107,264 B" in reasons(1)[0]
