"""Whether this Triton's automatic warp specialization changes the sm_90 forward's
machine code (the full run's check, written into the report)."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

from .build import _select, compile_job
from .compile import Job


def check_warp_specialization(jobs: int) -> list[dict]:
    """Compile the sm_90 forward's default tiles (no bias, TMA, head dims 64 and 128)
    and a 4-warp tile with the unmasked loop marked for Triton's automatic warp
    specialization (tl.range(..., warp_specialize=True)), and compare with the plain
    compile: whether this Triton specialises anything on Hopper."""
    import torch

    fl = _select()
    pairs = []
    for d in (64, 128):
        c = fl.configs_for("fwd", d, torch.float16, "sm90", "none")[0]
        for cfg in ((c.block_m, c.block_n, c.num_warps, c.num_stages, int(c.reload)), (64, 64, 4, 2, 0)):
            pairs.append([Job("fwd", d, "fp16", cfg, 90, "none", tma=True, warp_specialize=ws) for ws in (False, True)])
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(compile_job, [j for pair in pairs for j in pair]))
    out = []
    for plain, spec in zip(results[::2], results[1::2]):
        j = spec.job
        if spec.error:
            verdict = spec.error
        elif spec.sass_digest == plain.sass_digest:
            verdict = "the same machine code"
        else:
            verdict = (
                f"different machine code: instr/score {spec.instr_per_score:.3f} against "
                f"{plain.instr_per_score:.3f}, {spec.regs} registers against {plain.regs}"
            )
        out.append({"head_dim": j.head_dim, "config": j.config_name, "verdict": verdict})
    return out
