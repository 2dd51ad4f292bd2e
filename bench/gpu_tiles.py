#!/usr/bin/env python3
"""Every shipped tile of the Triton flash-attention kernel on this GPU, against the
float64 reference; then the kernel's speed beside torch's SDPA.

    python bench/gpu_tiles.py OUTDIR [--seconds 240] [--workers 10] [--timing-seconds 90]
                                     [--skip-tiles] [--timing-case NAME ...] [--no-host]

The CPU tests run the kernel's paths in Triton's interpreter and the static report reads
what the compiler makes of each tile; neither runs the machine code. This does:

* **tiles** (OUTDIR/tiles.jsonl, one line per run): for every tile list this GPU runs
  (its own target, and the sm_80 lists too on a Hopper GPU, which runs them),
  every dtype, one head dim per band (40 ... 512), each bias variant (none, key padding,
  full, and the last two with the bias's gradient), causal or not, TMA or pointer loads: the forward alone,
  then forward and backward, with the i-th candidate of every list forced (i = 0 is
  the default, what runs with ATTNKIT_TRITON_AUTOTUNE=0), against the float64
  reference under the tolerance rule of attnkit.testing (twice plain torch's error in
  the same dtype, plus rounding); every buffer a kernel writes starts as NaN. Defaults
  first, then the other candidates, until the time is up: the summary says how many of
  the shipped tiles ran.
* **timing** (OUTDIR/timing.json): milliseconds and TFLOP/s of flash_attention (default
  tiles, and autotuned where marked) and of torch's scaled_dot_product_attention on the
  same inputs, forward and forward+backward, at head dims 40-512, causal and with
  key padding; the ratio is measured in one process, one case after the other.
  ``--timing-case NAME`` (repeatable) times those cases of TIMING only; the autotuned
  pass ends with what the autotuner chose, which tools/records turns into per-GPU
  default tiles. Then the host time of a tiny call (left out with ``--no-host``).
  A SIGINT (bench/gpu_suite.sh's cap) ends the timing and keeps what was measured.

OUTDIR/summary.md holds both tables. Needs a CUDA GPU, torch and triton; attnkit must be
importable (installed, or staged on PYTHONPATH as bench/gpu_suite.sh stages it).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import multiprocessing as mp
import os
import queue
import sys
import time
import traceback

DTYPES = ("fp16", "bf16", "fp32")
HEAD_DIMS = (40, 80, 128, 160, 256, 320, 384, 512)  # one per band of limits.BANDS but 64
VARIANTS = ("none", "keypad", "full", "full_grad", "keypad_grad")  # _grad: the bias needs its gradient


def kernels_fwd(dt: str) -> tuple:
    return ("fwd",) if dt == "fp32" else ("fwd", "fwd_lo")  # fwd_lo: a 16-bit forward for a backward


KERNELS_BWD = {
    "none": ("dkdv", "dq"),
    "keypad": ("dkdv", "dq"),
    "full": ("dkdv", "dq"),
    "full_grad": ("dq_dbias", "dkdv"),
    "keypad_grad": ("dkdv_dbias", "dq"),
}


def _torch_dtype(name):
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]


def select_module():
    """Which tile serves a flash kernel's launch (its tile lists: configs_for)."""
    return importlib.import_module("attnkit.kernels.flash.select")


def list_lengths(lists: str, dt: str, D: int, variant: str, causal: bool, loads: str) -> dict:
    """{kernel: number of candidates} of the lists a call of this kind uses."""
    fa = select_module()
    v = variant.removesuffix("_grad")
    return {
        k: len(fa.configs_for(k, D, _torch_dtype(dt), lists, v, causal, loads == "tma"))
        for k in kernels_fwd(dt) + KERNELS_BWD[variant]
    }


def plan(native: str, dtypes=DTYPES, head_dims=HEAD_DIMS, variants=VARIANTS, lists_too=True, min_index=0) -> list[dict]:
    """Every job, defaults first: (lists, dtype, head dim, variant, causal, loads, index);
    min_index leaves out each list's first candidates (a run that follows one which
    checked the defaults)."""
    combos = []
    for lists in [native] + (["sm80"] if native == "sm90" and lists_too else []):
        for dt in dtypes:
            for D in head_dims:
                for variant in variants:
                    for causal in (False, True):
                        for loads in ("tma", "ptr") if lists == "sm90" and dt != "fp32" else ("ptr",):
                            n = max(list_lengths(lists, dt, D, variant, causal, loads).values())
                            combos.append((lists, dt, D, variant, causal, loads, n))
    jobs = []
    for index in range(min_index, max(c[-1] for c in combos)):
        for lists in [native, "sm80"]:
            for c in combos:
                if c[0] == lists and index < c[-1]:
                    jobs.append(dict(zip(("lists", "dtype", "D", "variant", "causal", "loads"), c[:-1]), index=index))
    # each (lists, index) once: the native lists' defaults, then sm80's, then index 1 ...
    # and within each, the diffusion models' cases first: 16-bit, head dims up to 160.
    order = {(native, 0): 0, ("sm80", 0): 1}
    jobs.sort(
        key=lambda j: (
            order.get((j["lists"], j["index"]), 2 + 2 * j["index"] + (j["lists"] != native)),
            j["dtype"] == "fp32",
            j["D"] > 160,
        )
    )
    return jobs


def _check(out, ref, base, eps, name):
    from attnkit.testing import rel_error

    if ref.norm() == 0:
        err, tol = float(out.double().norm()), eps
    else:
        err, tol = rel_error(out, ref), 2.0 * rel_error(base, ref) + eps
    ok = math.isfinite(err) and err <= tol
    return {"what": name, "err": err, "tol": tol, "ok": ok}


def run_job(job: dict) -> dict:
    """Run one job in this process; returns its record (checks, tiles used, error)."""
    import torch

    from attnkit.kernels import flash_attention_with_lse
    from attnkit.testing import EPSILON, make_bias, make_qkv, reference_attention, torch_math_attention

    dev = torch.device(job.get("device", "cuda"))
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    dt = _torch_dtype(job["dtype"])
    D, variant, causal, index = job["D"], job["variant"], job["causal"], job["index"]
    used = set()
    launcher = importlib.import_module("attnkit.kernels.launcher")

    def one_candidate(kernel, cands, tma):
        c = cands[index % len(cands)]
        used.add(f"{kernel}:{'tma' if tma else 'ptr'}:{c}")
        return (c,)

    # Launch plans are keyed by the settings: each job's candidate, target and poisoned
    # outputs make plans of their own.
    forced = launcher.override(candidates=one_candidate, arch=job["lists"], poison_outputs=True)
    forced.__enter__()
    rec = dict(job, checks=[], tiles=[], error=None)
    try:
        B, H = 2, 2
        M, N = (300, 300) if causal else (257, 300)
        q, k, v = make_qkv(B, H, M, N, D, dt, device=dev)
        kind = {"none": "none", "keypad": "key_padding", "full": "full"}[variant.removesuffix("_grad")]
        bias = make_bias(kind, B, H, M, N, dt, device=dev)
        mask = None
        if causal:
            i = torch.arange(M, device=dev)[:, None]
            j = torch.arange(N, device=dev)[None, :]
            mask = torch.zeros(M, N, dtype=torch.float64, device=dev).masked_fill(j > i, float("-inf"))

        def full_bias(b, dtype):
            out = None if b is None else b.to(dtype)
            if mask is not None:
                out = mask.to(dtype) if out is None else out + mask.to(dtype)
            return out

        eps = EPSILON[dt]
        sixteen_bit_tma = job["lists"] == "sm90" and job["dtype"] != "fp32"

        def place(t):
            """A copy of t; for the "ptr" runs of sm_90's 16-bit lists, at an address and
            row stride TMA cannot take (2 bytes off), so that the launcher itself picks
            pointer loads, or copies to aligned buffers where a kernel has no pointer tile."""
            if not (sixteen_bit_tma and job["loads"] == "ptr"):
                return t.clone()
            buf = torch.empty(*t.shape[:-1], t.shape[-1] + 1, dtype=t.dtype, device=t.device)
            view = buf[..., 1:]
            view.copy_(t)
            return view

        for grads in (False, True):
            bias_grad = grads and variant.endswith("_grad")
            inputs = [q, k, v] + ([bias] if bias_grad else [])
            inputs = [place(t.detach()).requires_grad_(grads) for t in inputs]
            b_in = inputs[3] if bias_grad else bias
            out, lse = flash_attention_with_lse(*inputs[:3], b_in, causal=causal)
            sync()
            ref_in = [t.detach().double().requires_grad_(grads) for t in inputs]
            ref = reference_attention(*ref_in[:3], full_bias(ref_in[3] if bias_grad else bias, torch.float64))
            base_in = [t.detach().clone().requires_grad_(grads) for t in inputs]
            base = torch_math_attention(*base_in[:3], full_bias(base_in[3] if bias_grad else bias, torch.float32))
            tag = "fwd+bwd" if grads else "fwd"
            rec["checks"].append(_check(out.detach(), ref.detach(), base.detach(), eps, f"{tag} out"))
            scores = ref_in[0].detach() @ ref_in[1].detach().transpose(-1, -2) * D**-0.5
            fb = full_bias(None if bias is None else bias.detach(), torch.float64)
            ref_lse = torch.logsumexp(scores if fb is None else scores + fb, -1)
            seen = torch.isfinite(ref_lse)
            lse_ok = bool(torch.equal(torch.isneginf(lse.detach()), ~seen))
            from attnkit.testing import rel_error

            lse_err = rel_error(lse.detach()[seen], ref_lse[seen])
            rec["checks"].append({"what": f"{tag} lse", "err": lse_err, "tol": 1e-5, "ok": lse_ok and lse_err < 1e-5})
            if grads:
                do = torch.randn_like(out)
                got = torch.autograd.grad(out, inputs, do)
                ref_g = torch.autograd.grad(ref, ref_in, do.double())
                base_g = torch.autograd.grad(base, base_in, do)
                sync()
                for name, g, r, bg in zip(("dq", "dk", "dv", "dbias"), got, ref_g, base_g):
                    rec["checks"].append(_check(g, r, bg, eps, name))
    except Exception as e:  # noqa: BLE001 (the error is the result)
        rec["error"] = f"{type(e).__name__}: {str(e)[:600]}"
        rec["trace"] = traceback.format_exc()[-1500:]
    finally:
        forced.__exit__(None, None, None)
        launcher.clear_plans()  # they hold this job's candidate: none is served again
    rec["tiles"] = sorted(used)
    rec["ok"] = rec["error"] is None and all(c["ok"] for c in rec["checks"])
    return rec


def _worker(jobs, results):
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    import torch  # noqa: F401

    while True:
        try:
            job = jobs.get(timeout=1)
        except queue.Empty:
            return
        t0 = time.time()
        rec = run_job(job)
        rec["seconds"] = round(time.time() - t0, 2)
        results.put(rec)
        if rec["error"] and ("CUDA" in rec["error"] or "illegal" in rec["error"]):
            return  # this process's CUDA context may be broken: a fresh worker takes over


def sweep(outdir: str, seconds: float, workers: int, min_index: int = 0, **only) -> list[dict]:
    import torch

    native = select_module().arch_of(torch.device("cuda"))
    jobs = plan(native, min_index=min_index, **only)
    ctx = mp.get_context("spawn")
    jq, rq = ctx.Queue(), ctx.Queue()
    for j in jobs:
        jq.put(j)
    procs = [ctx.Process(target=_worker, args=(jq, rq), daemon=True) for _ in range(workers)]
    for p in procs:
        p.start()
    deadline = time.time() + seconds
    records = []
    path = os.path.join(outdir, "tiles.jsonl")
    with open(path, "w") as f:
        while time.time() < deadline and len(records) < len(jobs):
            try:
                rec = rq.get(timeout=2)
            except queue.Empty:
                procs = [p for p in procs if p.is_alive()] or procs
                alive = [p for p in procs if p.is_alive()]
                if len(alive) < workers and not jq.empty():
                    for _ in range(workers - len(alive)):
                        p = ctx.Process(target=_worker, args=(jq, rq), daemon=True)
                        p.start()
                        procs.append(p)
                elif not alive:
                    break
                continue
            records.append(rec)
            f.write(json.dumps(rec) + "\n")
            f.flush()
            if len(records) % 25 == 0:
                bad = sum(not r["ok"] for r in records)
                print(
                    f"[tiles] {len(records)}/{len(jobs)} runs, {bad} failing, {deadline - time.time():.0f} s left",
                    flush=True,
                )
    for p in procs:
        if p.is_alive():
            p.kill()
    print(f"[tiles] {len(records)} of {len(jobs)} runs done", flush=True)
    return records, jobs, native


def shipped_tiles(native: str, dtypes=DTYPES, head_dims=HEAD_DIMS, variants=VARIANTS, lists_too=True) -> set:
    """Every (lists, kernel, loads, tile) the lists hold for the dtypes, head dims and
    variants the sweep runs."""
    fa = select_module()
    out = set()
    for lists in [native] + (["sm80"] if native == "sm90" and lists_too else []):
        for dt in dtypes:
            for D in head_dims:
                for v in sorted({v.removesuffix("_grad") for v in variants}):
                    for causal in (False, True):
                        for tma in (True, False) if lists == "sm90" and dt != "fp32" else (False,):
                            for kern in kernels_fwd(dt) + ("dkdv", "dq", "dkdv_dbias", "dq_dbias"):
                                for c in fa.configs_for(kern, D, _torch_dtype(dt), lists, v, causal, tma):
                                    out.add((lists, dt, D, v, causal, f"{kern}:{'tma' if tma else 'ptr'}:{c}"))
    return out


# -- timing -----------------------------------------------------------------------------------
# (name, B, H, M, N, D, causal, bias kind, backward)
TIMING = [
    ("sd15 d40", 2, 8, 4096, 4096, 40, False, "none", False),
    ("sd15 d40 cross77", 2, 8, 4096, 77, 40, False, "none", False),
    ("sd15 d80", 2, 8, 1024, 1024, 80, False, "none", False),
    ("sd15 d160", 2, 8, 256, 256, 160, False, "none", False),
    ("d128 keypad (Flux text)", 2, 24, 4608, 4608, 128, False, "key_padding", False),
    ("d128 keypad bwd", 2, 24, 4608, 4608, 128, False, "key_padding", True),
    ("d128", 4, 16, 4096, 4096, 128, False, "none", False),
    ("d128 bwd", 4, 16, 4096, 4096, 128, False, "none", True),
    ("d64", 4, 16, 4096, 4096, 64, False, "none", False),
    ("d64 bwd", 4, 16, 4096, 4096, 64, False, "none", True),
    ("d128 causal", 4, 16, 4096, 4096, 128, True, "none", False),
    ("d128 causal bwd", 4, 16, 4096, 4096, 128, True, "none", True),
    ("vae d512", 1, 1, 4096, 4096, 512, False, "none", False),
    ("d128 full bias", 2, 8, 4096, 4096, 128, False, "full", False),
]


TIMING_NAMES = tuple(c[0] for c in TIMING)
INTERRUPTED = "interrupted"  # a case's "skipped": the run was stopped (SIGINT) before or in it


def timing_cases(names=None) -> list[tuple]:
    """The cases of TIMING named (all where names is None or empty), in TIMING's order."""
    if not names:
        return list(TIMING)
    unknown = sorted(set(names) - set(TIMING_NAMES))
    if unknown:
        raise ValueError(
            f"no timing case named {', '.join(map(repr, unknown))}; the cases: {', '.join(map(repr, TIMING_NAMES))}"
        )
    return [c for c in TIMING if c[0] in set(names)]


def timing(outdir: str, seconds: float, autotune: bool, cases=None) -> list[dict]:
    """Each case (default: all of TIMING), attnkit beside SDPA. A SIGINT ends the pass: the
    case it cut is marked "interrupted" and what the autotuner chose so far still follows."""
    os.environ["ATTNKIT_TRITON_AUTOTUNE"] = "1" if autotune else "0"
    # Autotuning off times the shipped defaults, not a GPU's recorded ones
    # (attnkit/kernels/tile_rules.py): a record compares the two.
    os.environ["ATTNKIT_TILE_RECORDS"] = "0"
    # Both switches are in every plan's key (launcher.settings()): the plans of the other
    # setting are not served; forgotten here to free them.
    importlib.import_module("attnkit.kernels.launcher").clear_plans()
    deadline = time.time() + seconds
    rows = []
    todo = timing_cases(cases)
    try:
        for name, B, H, M, N, D, causal, kind, bwd in todo:
            if time.time() > deadline:
                rows.append({"case": name, "skipped": "time budget"})
                continue
            time_case(rows, autotune, name, B, H, M, N, D, causal, kind, bwd)
    except KeyboardInterrupt:  # keep what was measured; the cases not reached are named
        rows += [{"case": c[0], "skipped": INTERRUPTED} for c in todo[len(rows) :]]
    if autotune:
        # What the autotuner chose, per list and length bucket (the default is each list's
        # first): keys (head dim, lengths rounded up to powers of two, causal, ...), the
        # choice the bucket's later calls run (a bucket first met inside a CUDA-graph
        # capture runs the list's first tile and logs nothing).
        # Tuners of one list whose candidates differ by head dim log under the list's name
        # (their keys hold the head dim).
        choices: dict = {}
        for key, chosen in select_module().tuner_choices().items():
            choices.setdefault("/".join(map(str, key[:7])), {}).update({str(k): str(c) for k, c in chosen.items()})
        rows.append({"case": "autotuner choices", "choices": choices})
    return rows


def time_case(rows, autotune, name, B, H, M, N, D, causal, kind, bwd):
    """One case of TIMING, its row appended to rows."""
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench

    from attnkit.kernels import flash_attention
    from attnkit.kernels.limits import attention_flops
    from attnkit.testing import make_bias, make_qkv, rel_error

    torch.manual_seed(0)
    q, k, v = make_qkv(B, H, M, N, D, torch.float16, device="cuda", requires_grad=bwd)
    bias = make_bias(kind, B, H, M, N, torch.float16, device="cuda")
    flops = attention_flops(B, H, M, N, D, backward=False, causal=causal)
    if bwd:
        flops += attention_flops(B, H, M, N, D, backward=True, causal=causal)
    do = torch.randn(B, H, M, D, device="cuda", dtype=torch.float16)

    def ours():
        o = flash_attention(q, k, v, bias, causal=causal)
        if bwd:
            torch.autograd.grad(o, (q, k, v), do)
        return o

    def sdpa():
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal)
        if bwd:
            torch.autograd.grad(o, (q, k, v), do)
        return o

    row = {
        "case": name,
        "shape": [B, H, M, N, D],
        "causal": causal,
        "bias": kind,
        "backward": bwd,
        "autotune": autotune,
    }
    try:
        t0 = time.time()
        a, b = ours(), sdpa()
        row["first_call_s"] = round(time.time() - t0, 2)
        row["rel_diff_vs_sdpa"] = rel_error(a.detach(), b.detach())
        for label, fn in (("attnkit", ours), ("sdpa", sdpa)):
            ms = do_bench(fn, warmup=25, rep=100)
            row[f"{label}_ms"] = ms
            row[f"{label}_tflops"] = flops / ms / 1e9
        row["speedup_vs_sdpa"] = row["sdpa_ms"] / row["attnkit_ms"]
    except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
    print(f"[timing] {json.dumps(row)}", flush=True)
    rows.append(row)
    q = k = v = bias = do = None  # this case's memory, free before the next one
    torch.cuda.empty_cache()


def overhead(outdir: str) -> list[dict]:
    """Host time per call where the GPU work is tiny (2 x 8 heads x 64 x 77 x 40): what a
    call costs the CPU, which bounds small calls (cross-attention to text). Wall time of
    many calls with one synchronisation at the end; then a profile of the launcher."""
    import cProfile
    import io
    import pstats

    import torch
    import torch.nn.functional as F

    from attnkit.kernels import flash_attention
    from attnkit.testing import make_qkv

    q, k, v = make_qkv(2, 8, 64, 77, 40, torch.float16, device="cuda")
    rows = []
    for label, autotune, fn in (
        ("attnkit, autotune off", "0", lambda: flash_attention(q, k, v)),
        ("attnkit, autotune on", "1", lambda: flash_attention(q, k, v)),
        ("sdpa", "1", lambda: F.scaled_dot_product_attention(q, k, v)),
    ):
        os.environ["ATTNKIT_TRITON_AUTOTUNE"] = autotune
        importlib.import_module("attnkit.kernels.launcher").clear_plans()  # the switch is read when a plan is built
        with torch.no_grad():
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(500):
                fn()
            torch.cuda.synchronize()
        rows.append({"case": f"host overhead: {label}", "us_per_call": (time.perf_counter() - t0) / 500 * 1e6})
        print(f"[overhead] {rows[-1]}", flush=True)
    os.environ["ATTNKIT_TRITON_AUTOTUNE"] = "1"
    prof = cProfile.Profile()
    with torch.no_grad():
        prof.enable()
        for _ in range(300):
            flash_attention(q, k, v)
        prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    with open(os.path.join(outdir, "overhead_profile.txt"), "w") as f:
        f.write(buf.getvalue())
    return rows


def summarize(outdir, records, jobs, native, timings, only, min_index=0):
    import torch

    lines = [f"# The Triton kernel on {torch.cuda.get_device_name()} (target lists: {native})", ""]
    import triton

    lines += [
        f"torch {torch.__version__}, triton {triton.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
    ]
    bad = [r for r in records if not r["ok"]]
    ran = {
        (r["lists"], r["dtype"], r["D"], r["variant"].removesuffix("_grad"), r["causal"], t)
        for r in records
        if r["ok"]
        for t in r["tiles"]
    }
    shipped = shipped_tiles(native, **only)
    if not jobs:  # --skip-tiles: say so, not "0 of N shipped passed"
        lines += ["## Every shipped tile against float64", "", "- not run (--skip-tiles)", ""]
    else:
        lines += [
            "## Every shipped tile against float64",
            "",
            f"- runs: {len(records)} of {len(jobs)} planned, {len(bad)} failing"
            + (f" (each list's first {min_index} candidates left out: --min-index)" if min_index else ""),
            f"- (lists, dtype, head dim, variant, causal, kernel, loads, tile) combinations that ran and "
            f"passed: {len(ran & shipped)} of {len(shipped)} shipped",
            "",
        ]
    for lists in sorted({j["lists"] for j in jobs}):
        mine = [r for r in records if r["lists"] == lists]
        sh = {s for s in shipped if s[0] == lists}
        lines.append(
            f"- {lists} lists: {len(mine)} runs, {sum(not r['ok'] for r in mine)} failing; "
            f"tiles covered {len({s for s in ran if s[0] == lists} & sh)} of {len(sh)}"
        )
    if bad:
        lines += ["", "| lists | dtype | D | variant | causal | loads | index | what failed |", "|" + "---|" * 8]
        for r in bad[:80]:
            what = r["error"] or "; ".join(
                f"{c['what']} {c['err']:.2e} > {c['tol']:.2e}" for c in r["checks"] if not c["ok"]
            )
            lines.append(
                f"| {r['lists']} | {r['dtype']} | {r['D']} | {r['variant']} | {int(r['causal'])} | "
                f"{r['loads']} | {r['index']} | {what[:300]} |"
            )
    lines += [
        "",
        "## Speed beside torch's SDPA (fp16)",
        "",
        "| case | B, H, M, N, D | autotune | attnkit ms | TFLOP/s | SDPA ms | TFLOP/s | SDPA / attnkit | first call s |",
        "|" + "---|" * 9,
    ]
    for t in timings:
        if "choices" in t:
            continue
        if "us_per_call" in t:
            lines.append(f"| {t['case']} | | | {t['us_per_call']:.1f} us per call | | | | | |")
        elif "attnkit_ms" in t:
            lines.append(
                f"| {t['case']} | {', '.join(map(str, t['shape']))} | {'on' if t['autotune'] else 'off'} | "
                f"{t['attnkit_ms']:.3f} | {t['attnkit_tflops']:.0f} | {t['sdpa_ms']:.3f} | "
                f"{t['sdpa_tflops']:.0f} | {t['speedup_vs_sdpa']:.2f} | {t['first_call_s']} |"
            )
        else:
            lines.append(f"| {t['case']} | | | {t.get('error') or t.get('skipped')} | | | | | |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(outdir, "summary.md"), "w") as f:
        f.write(text)
    print(text, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (no GPU needed): an unknown option or timing case is an error."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--seconds", type=float, default=240, help="time for the tile sweep")
    ap.add_argument("--workers", type=int, default=min(10, max(1, (os.cpu_count() or 2) - 2)))
    ap.add_argument(
        "--timing-seconds",
        type=float,
        default=90,
        help="time for the timing (with default tiles, then autotuned: see --autotune-share); 0 leaves it out",
    )
    ap.add_argument(
        "--autotune-share",
        type=float,
        default=0.3,
        help="the share of --timing-seconds the autotuned pass gets (default %(default)s; it compiles "
        "every candidate of each list)",
    )
    ap.add_argument(
        "--timing-case",
        action="append",
        choices=TIMING_NAMES,
        metavar="NAME",
        help="repeatable; time these cases only, in the table's order (default all: "
        + ", ".join(map(repr, TIMING_NAMES))
        + ")",
    )
    ap.add_argument(
        "--no-host", action="store_true", help="leave out the host time per call of a tiny call (and its profile)"
    )
    ap.add_argument("--skip-tiles", action="store_true")
    ap.add_argument("--dtype", action="append", choices=DTYPES, help="repeatable; default all")
    ap.add_argument("--head-dim", action="append", type=int, help=f"repeatable; default {HEAD_DIMS}")
    ap.add_argument("--variant", action="append", choices=VARIANTS, help="repeatable; default all")
    ap.add_argument("--native-only", action="store_true", help="on sm_90, leave out the sm_80 lists")
    ap.add_argument(
        "--min-index", type=int, default=0, help="leave out each list's first N candidates (1: all but the defaults)"
    )
    args = ap.parse_args(argv)
    if not 0 < args.autotune_share < 1:
        ap.error(f"--autotune-share {args.autotune_share}: must be between 0 and 1 (both passes run)")
    if args.min_index < 0:
        ap.error(f"--min-index {args.min_index}: must be 0 or more")
    return args


def main(argv=None):
    args = parse_args(argv)
    only = dict(
        dtypes=tuple(args.dtype or DTYPES),
        head_dims=tuple(args.head_dim or HEAD_DIMS),
        variants=tuple(args.variant or VARIANTS),
        lists_too=not args.native_only,
    )
    import torch

    if not torch.cuda.is_available():
        sys.exit(
            "gpu_tiles: needs a CUDA GPU; on a CPU, tests/kernels/test_kernel_paths.py runs these paths in "
            "Triton's interpreter"
        )
    os.makedirs(args.outdir, exist_ok=True)
    records, jobs, native = ([], [], select_module().arch_of(torch.device("cuda")))
    if not args.skip_tiles:
        records, jobs, native = sweep(args.outdir, args.seconds, args.workers, args.min_index, **only)
    timings = []
    if args.timing_seconds > 0:
        cases = args.timing_case
        timings = timing(args.outdir, args.timing_seconds * (1 - args.autotune_share), autotune=False, cases=cases)
        # A SIGINT (the suite's cap) stops the run: what was measured is still written.
        if not any(t.get("skipped") == INTERRUPTED for t in timings):
            timings += timing(args.outdir, args.timing_seconds * args.autotune_share, autotune=True, cases=cases)
        if not (args.no_host or any(t.get("skipped") == INTERRUPTED for t in timings)):
            try:
                timings += overhead(args.outdir)
            except Exception as e:  # noqa: BLE001 (the rest of the record still counts)
                timings.append({"case": "host overhead", "error": f"{type(e).__name__}: {e}"[:300]})
        with open(os.path.join(args.outdir, "timing.json"), "w") as f:
            json.dump(timings, f, indent=1)
    summarize(args.outdir, records, jobs, native, timings, only, args.min_index)


if __name__ == "__main__":
    main()
