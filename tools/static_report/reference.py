"""Triton's tutorial fused attention (06-fused-attention.py, not shipped), compiled and
read the same way as our kernels, for comparison (--reference FILE)."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import tempfile

from . import sass
from .compile import ISSUE_PER_CLOCK, TENSOR_FLOPS_PER_CLOCK, Job, Result, _compile, _read_cubin, analyse


def load_reference(path: str):
    """The @triton.jit functions of a copy of Triton's tutorial 06-fused-attention.py,
    as a module (its autotune decorators and host code left out: they need a GPU at
    import). The file is not part of attnkit; pass where you keep one."""
    with open(path) as f:
        source = f.read()
    tree = ast.parse(source)
    parts = ["import triton\nimport triton.language as tl\n"]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            body = ast.get_source_segment(source, node)
            parts.append("@triton.jit\n" + body)
    tmp = tempfile.NamedTemporaryFile("w", suffix="_reference_attention.py", delete=False)
    tmp.write("\n\n".join(parts))
    tmp.close()
    spec = importlib.util.spec_from_file_location("attnkit_reference_attention", tmp.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The tutorial's tiles: its forward autotunes over these on sm_90 (128 x 64 on 4 warps,
# 128 x 128 on 8, TMA loads); its backward has one fixed configuration.
REFERENCE_FWD = ((128, 64, 4, 3), (128, 128, 8, 3), (128, 128, 4, 3))
REFERENCE_BWD = dict(BLOCK_M1=32, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=32, BLK_SLICE_FACTOR=2, warps=4, stages=5)


def compile_reference(path: str, head_dim: int, arch: int = 90) -> list[dict]:
    """Rows for the tutorial's forward (_attn_fwd_tma, not causal) and backward
    (_attn_bwd, which is always causal: its unmasked dK/dV and dQ loops are read) at one
    head dim, fp16, compiled like ours."""
    os.environ.pop("TRITON_INTERPRET", None)
    from triton.compiler import ASTSource

    mod = load_reference(path)
    rows = []
    for bm, bn, warps, stages in REFERENCE_FWD:
        if bn > head_dim:
            continue  # the tutorial asserts BLOCK_N <= HEAD_DIM
        fn = mod._attn_fwd_tma
        sig = {"sm_scale": "fp32", "M": "*fp32", "Z": "i32", "H": "i32", "N_CTX": "i32"}
        for name, r in (("desc_q", bm), ("desc_k", bn), ("desc_v", bn), ("desc_o", bm)):
            sig[name] = f"tensordesc<fp16[{r},{head_dim}]>"
        for p in fn.params:
            sig.setdefault(p.name, "constexpr")
        consts = dict(HEAD_DIM=head_dim, BLOCK_M=bm, BLOCK_N=bn, FP8_OUTPUT=False, STAGE=1)
        attrs = {(fn.arg_names.index("M"),): [["tt.divisibility", 16]]}
        res = Result(Job("ref_fwd", head_dim, "fp16", (bm, bn, warps, stages, 0), arch, "none", tma=True))
        try:
            kernel = _compile(ASTSource(fn, sig, consts, attrs), arch, warps, stages, {"enable_fp_fusion": True})
            analyse(res, kernel, warps, bm * bn, head_dim, 2, 1.0 + 1.0 / bn)
        except Exception as e:  # noqa: BLE001
            res.error = f"compile failed: {type(e).__name__}: {str(e).splitlines()[0][:150]}"
        rows.append(res)
    # Backward: one kernel, four loops (dK/dV masked and unmasked, dQ masked and
    # unmasked); each is told apart by its matrix FLOPs per iteration.
    fn = mod._attn_bwd
    cfg = REFERENCE_BWD
    sig = {p.name: ("constexpr" if p.is_constexpr else "*fp16") for p in fn.params}
    sig.update(
        sm_scale="fp32",
        M="*fp32",
        D="*fp32",
        stride_z="i32",
        stride_h="i32",
        stride_tok="i32",
        H="i32",
        N_CTX="i32",
        stride_d="constexpr",
    )
    consts = {k: v for k, v in cfg.items() if k not in ("warps", "stages")}
    consts.update(HEAD_DIM=head_dim, stride_d=1)  # Triton specialises a stride of 1 into a constant
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params) if sig[p.name].startswith("*")}
    kernel = _compile(ASTSource(fn, sig, consts, attrs), arch, cfg["warps"], cfg["stages"], {"enable_fp_fusion": True})
    usage, listing = _read_cubin(kernel)
    instrs = sass.parse(listing)
    m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    for name, bm, bn, mm in (
        ("ref_dkdv", cfg["BLOCK_M1"], cfg["BLOCK_N1"], 4),
        ("ref_dq", cfg["BLOCK_M2"], cfg["BLOCK_N2"], 3),
    ):
        need = mm * 2.0 * bm * bn * head_dim
        loop = next(
            (lp for lp in sass.loops(instrs) if lp.matrix_instrs and abs(lp.mma_flops(cfg["warps"]) / need - 1) < 0.01),
            None,
        )
        res = Result(Job(name, head_dim, "fp16", (bm, bn, cfg["warps"], cfg["stages"], 0), arch, "none", True))
        res.regs, res.stack, res.smem = int(m.group(1)), int(m.group(2)), int(kernel.metadata.shared)
        res.matrix = "wgmma" if sass.kernel_uses(instrs, "HGMMA") else "mma"
        res.tma_loads = sass.kernel_uses(instrs, "UTMALDG")
        if loop is not None:
            res.loop_length = loop.length
            res.mma_mix = dict(loop.mma_shapes())
            res.loop_mix = dict(loop.mix().most_common())
            res.instr_per_score = loop.length * cfg["warps"] / (bm * bn)
            res.exp_per_score = loop.count("MUFU.EX2") * 32 * cfg["warps"] / (bm * bn)
            res.exp_least = 1.0
            res.mma_duplication = loop.mma_flops(cfg["warps"]) / need
            res.tensor_limit = mm * 2 * head_dim * ISSUE_PER_CLOCK / TENSOR_FLOPS_PER_CLOCK[arch]
        rows.append(res)
    return rows
