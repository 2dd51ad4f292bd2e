"""The int8 forward's main loop against the exact forward's: the target that an integer
Q.K, which does twice the work per instruction, gives a loop no longer than the exact
kernel's.

* int8-loop (sm_90 and sm_80, fp16 and bf16, head dims 64 and 128, no bias, not
  causal): the int8 forward's default tile issues at most the exact forward's default's
  instr/score (TMA on sm_90, the loads aligned inputs run; pointer loads on sm_80). The
  exact forward with pointer loads is shown beside it on sm_90, the loads the int8 kernel
  has. A target not met says why in NOT_MET, with the figures of the run.

targets.evaluate adds these verdicts; targets' report section renders them (section()).
"""

from __future__ import annotations

LOOP_HEAD_DIMS = (64, 128)
PREFIX = "int8-loop-"

_NO_TMA = (
    "The exact forward's default on sm_90 streams K and V through TMA; the int8 forward loads them "
    "through pointers. The exact forward with pointer loads, the int8 kernel's, reads {ptr}: the int8 "
    "loop is within a few percent of that or shorter, its integer Q.K (IGMMA, 32-deep: half the 16-bit "
    "MMA instructions) saving about what the conversion of each product to float costs (one I2FP per "
    "score, 1/32 instr/score), which the exact kernel does not have. TMA loads in the int8 kernel were "
    "tried (128 x 128 tile, 8 warps, fp16): 0.254 at head dim 64 and 0.278 at 128 against 0.252 and "
    "0.283 with pointers, so the loads are not the gap; the conversion is, and no form of it is shorter "
    "than one instruction per score."
)
NOT_MET = {f"{PREFIX}sm90-d{d}-{dt}": _NO_TMA for d in LOOP_HEAD_DIMS for dt in ("fp16", "bf16")}


def exact_defaults(results, tma=None) -> dict:
    """(arch, head dim, dtype) -> the exact forward's default row without bias, not
    causal, with TMA loads (tma=True), pointer loads (False), or the loads aligned inputs
    run on its target (None: TMA on sm_90, pointers on sm_80)."""
    out = {}
    for r in results:
        j = r.job
        loads = (j.arch == 90) if tma is None else tma
        if j.kernel == "fwd" and j.bias == "none" and j.default and not j.causal and j.tma == loads:
            out[(j.arch, j.head_dim, j.dtype)] = r
    return out


def int8_defaults(results, arch: int) -> list:
    """The int8 forward's default rows without bias, not causal, on target ``arch``."""
    return [
        r
        for r in results
        if r.job.kernel == "int8" and r.job.arch == arch and r.job.bias == "none" and not r.job.causal and r.job.default
    ]


def compare(results) -> list[dict]:
    """One verdict per target, head dim of LOOP_HEAD_DIMS and dtype whose int8 and exact
    rows this run has."""
    tma, ptr = exact_defaults(results, True), exact_defaults(results, False)
    out = []
    for arch in (90, 80):
        for r in int8_defaults(results, arch):
            j = r.job
            if j.head_dim not in LOOP_HEAD_DIMS or not r.loop_length:
                continue
            key = (arch, j.head_dim, j.dtype)
            base = (tma if arch == 90 else ptr).get(key) or ptr.get(key)
            if base is None or not base.loop_length:
                continue
            with_ptr = ptr.get(key)
            met = not r.problems and r.instr_per_score <= base.instr_per_score + 1e-12
            tid = f"{PREFIX}sm{arch}-d{j.head_dim}-{j.dtype}"
            note = ""
            if not met and tid in NOT_MET:
                shown = (
                    f"{with_ptr.job.config_name}: {with_ptr.instr_per_score:.3f}"
                    if with_ptr is not None
                    else "not compiled"
                )
                note = NOT_MET[tid].format(ptr=shown)
            out.append(
                {
                    "id": tid,
                    "target": "int8 main loop: instr/score at most the exact forward's default",
                    "value": r.instr_per_score,
                    "limit": base.instr_per_score,
                    "met": bool(met),
                    "kernel": "int8",
                    "head_dim": j.head_dim,
                    "dtype": j.dtype,
                    "bias": "none",
                    "arch": arch,
                    "config": j.config_name,
                    "causal": False,
                    "tma": False,
                    "exact_config": base.job.config_name,
                    "exact_tma": base.job.tma,
                    "exact_ptr_config": with_ptr.job.config_name if with_ptr is not None else None,
                    "exact_ptr_instr_per_score": with_ptr.instr_per_score if with_ptr is not None else None,
                    **({"note": note} if note else {}),
                }
            )
    return out


def section(verdicts: list[dict]) -> list[str]:
    """report.md's lines for the int8-loop verdicts (none: no lines)."""
    loop = [v for v in verdicts if v["id"].startswith(PREFIX)]
    if not loop:
        return []

    def f(x):
        return "-" if x is None else f"{x:.3f}"

    lines = [
        "",
        "INT8 main loop against the exact forward's default (no bias, not causal): "
        f"{sum(v['met'] for v in loop)} of {len(loop)} met. An integer Q.K does twice the work per "
        "instruction, so the int8 loop should be no longer; on sm_90 the exact forward with pointer "
        "loads (the int8 kernel's loads) is shown too.",
        "",
        "| target | D | dtype | int8 tile | int8 instr/score | exact default | its instr/score "
        "| exact, pointer loads | met | why not |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in loop:
        ptr = f"{v['exact_ptr_config']}: {f(v['exact_ptr_instr_per_score'])}" if v.get("exact_ptr_config") else "-"
        why = "" if v["met"] else v.get("note", "")
        lines.append(
            f"| sm_{v['arch']} | {v['head_dim']} | {v['dtype']} | {v['config']} | {f(v['value'])} | "
            f"{v['exact_config']}{' TMA' if v['exact_tma'] else ''} | {f(v['limit'])} | {ptr} | "
            f"{'yes' if v['met'] else '**no**'} | {why} |"
        )
    return lines


__all__ = ["LOOP_HEAD_DIMS", "NOT_MET", "PREFIX", "compare", "section"]
