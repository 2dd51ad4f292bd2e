"""What attnkit's processor layer costs, against diffusers' own AttnProcessor2_0.

    python bench/overhead.py                  # every part, on the CPU
    python bench/overhead.py --parts a --rounds-a 30
    python bench/overhead.py --device cuda

(a) per-call overhead: one small Attention module (SD1.5's first self-attention width:
    320 channels, 8 heads of 40, 64 tokens, batch 2), attnkit.SDPAProcessor vs diffusers'
    AttnProcessor2_0. Target: ratio <= 1.02.
(b) the SD1.5 UNet at full width (320/640/1280/1280, 8 heads) at 32x32 latents, batch 2,
    fp32: the same two processors. Target: ratio <= 1.01.
(c) the sliced backend against vanilla at 4096 tokens (SD1.5's 512x512 self-attention,
    batch 2, 8 heads of 40): peak memory and time.
(d) the transformer models through diffusers' dispatcher: one forward of the Flux-like and
    the Wan-like CPU presets (attnkit bench --preset flux / wan) with
    set_attention_backend("attnkit") against set_attention_backend("native").
    Target: ratio <= 1.02 each.
(e) the dispatch route per call: one small attention call (q/k/v (2, 77, 8, 40), fp32, as a
    transformer's processor makes it) and one tiny call (1, 64, 2, 16), where the host
    time is nearly all there is, through diffusers' dispatch_attention_fn with
    backend="attnkit" against backend="native", without a mask and with a (B, S) boolean
    key-padding mask (one mask tensor for every call, as a transformer passes the same mask
    to each of its layers). Target: ratio <= 1.10 each.
(l) the Triton kernel's launcher per call (bench/launch_cost.py): attnkit's own host time
    for one small flash_attention call (2x8x64x77x40, fp16), forward, forward with a
    key-padding mask, forward and backward. On the CPU the kernels' launches are replaced
    by a recorder (Triton's interpreter path, in a process of its own); on CUDA the
    launches are real and SDPA runs beside them. Targets: forward <= 10 us on the CPU;
    forward <= 25 us and forward + backward <= 150 us on a GPU.

Both processors run in one process, interleaved (the order alternates every round), after
a warm-up; each ratio is the median over rounds of (attnkit time / diffusers time) in
that round, so slow drift of the machine cancels. The inputs are random.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

TARGETS = {"a": 1.02, "b": 1.01, "d": 1.02, "e": 1.10}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(fns: dict, rounds: int, calls: int, device: torch.device, warmup: int = 2) -> dict:
    """Per-call seconds of each fn per round, the order alternating between rounds."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    _sync(device)
    times = {n: [] for n in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            _sync(device)
            start = time.perf_counter()
            for _ in range(calls):
                fns[name]()
            _sync(device)
            times[name].append((time.perf_counter() - start) / calls)
    return times


def summary(times: dict, ours: str, theirs: str) -> dict:
    ratios = [a / b for a, b in zip(times[ours], times[theirs])]
    return {
        "seconds_per_call": {n: statistics.median(v) for n, v in times.items()},
        "min_seconds": {n: min(v) for n, v in times.items()},
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratio_of_minimums": min(times[ours]) / min(times[theirs]),
        "rounds": len(ratios),
    }


def part_a(device: torch.device, dtype: torch.dtype, rounds: int, calls: int) -> dict:
    from diffusers.models.attention_processor import Attention, AttnProcessor2_0

    import attnkit

    torch.manual_seed(0)
    attn = Attention(query_dim=320, heads=8, dim_head=40).to(device, dtype).eval()
    x = torch.randn(2, 64, 320, device=device, dtype=dtype)
    ours, theirs = attnkit.SDPAProcessor(), AttnProcessor2_0()

    def run(proc):
        def fn():
            with torch.inference_mode():
                proc(attn, x)

        return fn

    with torch.inference_mode():
        torch.testing.assert_close(ours(attn, x), theirs(attn, x), rtol=1e-4, atol=1e-4)
    times = interleaved(
        {"attnkit.SDPAProcessor": run(ours), "diffusers.AttnProcessor2_0": run(theirs)}, rounds, calls, device
    )
    out = summary(times, "attnkit.SDPAProcessor", "diffusers.AttnProcessor2_0")
    out["setting"] = "Attention(query_dim=320, heads=8, dim_head=40), x (2, 64, 320)"
    return out


def part_b(device: torch.device, dtype: torch.dtype, rounds: int) -> dict:
    from diffusers import UNet2DConditionModel
    from diffusers.models.attention_processor import AttnProcessor2_0

    import attnkit
    from attnkit.bench.models import build_from_config, load_config

    unet = build_from_config(UNet2DConditionModel, load_config("sd15_unet.json"), device, dtype, seed=0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 32, 32, generator=g).to(device, dtype)
    t = torch.tensor(500, device=device)
    emb = torch.randn(2, 77, 768, generator=g).to(device, dtype)
    procs = {"attnkit.SDPAProcessor": attnkit.SDPAProcessor(), "diffusers.AttnProcessor2_0": AttnProcessor2_0()}

    def run(proc):
        def fn():
            unet.set_attn_processor(proc)  # a dict walk over 32 modules: microseconds
            with torch.inference_mode():
                unet(x, t, encoder_hidden_states=emb, return_dict=False)

        return fn

    times = interleaved({n: run(p) for n, p in procs.items()}, rounds, 1, device, warmup=1)
    out = summary(times, "attnkit.SDPAProcessor", "diffusers.AttnProcessor2_0")
    out["setting"] = f"SD1.5 UNet (320/640/1280/1280, 8 heads), 32x32 latents, batch 2, {dtype}, {device.type}"
    return out


def _attention_4096(device: torch.device, dtype: torch.dtype):
    from diffusers.models.attention_processor import Attention

    torch.manual_seed(0)
    attn = Attention(query_dim=320, heads=8, dim_head=40).to(device, dtype).eval()
    x = torch.randn(2, 4096, 320, device=device, dtype=dtype)
    return attn, x


def _memory_child(name: str, dtype: torch.dtype) -> dict:
    """Peak RSS of one call of `name` at 4096 tokens, in this (fresh) process."""
    import attnkit
    from attnkit.bench.env import reset_peak_rss, status_kb

    attn, x = _attention_4096(torch.device("cpu"), dtype)
    proc = attnkit.processor(name)
    with torch.inference_mode():
        proc(attn, x[:, :64])  # imports and first-call set-up outside the measurement
        before = (status_kb("VmRSS") or 0) * 1024
        reset = reset_peak_rss()
        proc(attn, x)
    peak = (status_kb("VmHWM") or 0) * 1024
    return {"peak_bytes": peak, "baseline_bytes": before, "over_baseline_bytes": peak - before, "reset": reset}


def part_d(device: torch.device, rounds: int) -> dict:
    """attnkit's diffusers backend against diffusers' native one, per forward, on the
    Flux-like and Wan-like CPU presets (random weights), interleaved."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    import attnkit  # noqa: F401  (registers the "attnkit" backend)
    from attnkit.bench.dit_model import build_transformer
    from attnkit.bench.presets import get_preset

    out = {}
    active = _AttentionBackendRegistry._active_backend
    try:
        for name in ("flux-cpu", "wan-cpu"):
            model = build_transformer(get_preset(name, device.type), device, seed=0)

            def run(backend, model=model):
                def fn():
                    model.transformer.set_attention_backend(backend)  # a walk over the modules
                    with torch.inference_mode():
                        model.forward(model.latents, 0.5)

                return fn

            times = interleaved({"attnkit": run("attnkit"), "native": run("native")}, rounds, 1, device, warmup=1)
            out[name] = summary(times, "attnkit", "native")
            out[name]["setting"] = get_preset(name, device.type).label
    finally:  # set_attention_backend also sets diffusers' process-wide backend
        _AttentionBackendRegistry.set_active_backend(active)
    return out


def part_e(device: torch.device, dtype: torch.dtype, rounds: int, calls: int) -> dict:
    """attnkit's diffusers backend against diffusers' native one on a small and a tiny
    dispatch_attention_fn call, with and without a key-padding mask, interleaved."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    import attnkit  # noqa: F401  (registers the "attnkit" backend)
    from attnkit.diffusers.backend import prepare

    prepare("attnkit")  # as set_attention_backend("attnkit") does
    ours, theirs = AttentionBackendName("attnkit"), AttentionBackendName("native")
    g = torch.Generator().manual_seed(0)
    out = {}
    for size, (b, s, h, d) in (("small", (2, 77, 8, 40)), ("tiny", (1, 64, 2, 16))):
        q, k, v = (torch.randn(b, s, h, d, generator=g).to(device, dtype) for _ in range(3))
        lengths = torch.tensor([s, s // 2 + 1][:b] if b > 1 else [s // 2 + 1], device=device)
        keep = torch.arange(s, device=device)[None, :] < lengths[:, None]  # (B, S), True = attend
        out.update(_part_e_size(size, (b, s, h, d), q, k, v, keep, ours, theirs, dtype, rounds, calls, device))
    return out


def _part_e_size(size, shape, q, k, v, keep, ours, theirs, dtype, rounds, calls, device) -> dict:
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    b, s, h, d = shape
    out = {}
    for kind, mask in (("no mask", None), ("key-padding mask", keep)):
        name = f"{size}, {kind}"

        def run(backend, mask=mask):
            def fn():
                with torch.inference_mode():
                    dispatch_attention_fn(q, k, v, attn_mask=mask, backend=backend)

            return fn

        with torch.inference_mode():
            torch.testing.assert_close(
                dispatch_attention_fn(q, k, v, attn_mask=mask, backend=ours),
                dispatch_attention_fn(q, k, v, attn_mask=mask, backend=theirs),
                rtol=1e-4,
                atol=1e-5,
            )
        times = interleaved({"attnkit": run(ours), "native": run(theirs)}, rounds, calls, device)
        out[name] = summary(times, "attnkit", "native")
        out[name]["setting"] = f"dispatch_attention_fn q/k/v ({b}, {s}, {h}, {d}) {dtype}, " + (
            "no mask" if mask is None else "attn_mask (B, S) bool key padding"
        )
    return out


def part_c(device: torch.device, dtype: torch.dtype, rounds: int) -> dict:
    import attnkit

    attn, x = _attention_4096(device, dtype)
    procs = {"vanilla": attnkit.processor("vanilla"), "sliced": attnkit.processor("sliced")}
    memory = {}
    if device.type == "cuda":
        for name, proc in procs.items():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            with torch.inference_mode():
                proc(attn, x)
            torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device)
            memory[name] = {"peak_bytes": peak, "baseline_bytes": before, "over_baseline_bytes": peak - before}
    else:
        for name in procs:
            res = subprocess.run(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--memory-child",
                    name,
                    "--dtype",
                    str(dtype).split(".")[1],
                ],
                capture_output=True,
                text=True,
            )
            memory[name] = (
                json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else {"error": res.stderr[-300:]}
            )

    def run(proc):
        def fn():
            with torch.inference_mode():
                proc(attn, x)

        return fn

    times = interleaved({n: run(p) for n, p in procs.items()}, rounds, 1, device, warmup=1)
    out = summary(times, "sliced", "vanilla")
    out["memory"] = memory
    if all("over_baseline_bytes" in m for m in memory.values()):
        out["memory_ratio_over_baseline"] = memory["sliced"]["over_baseline_bytes"] / max(
            memory["vanilla"]["over_baseline_bytes"], 1
        )
    out["setting"] = f"Attention(query_dim=320, heads=8, dim_head=40), x (2, 4096, 320), {dtype}, slice_size=auto"
    return out


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def _against_diffusers(
    part: str,
    what: str,
    r: dict,
    unit: float,
    time_fmt: str,
    unit_name: str,
    ratio_fmt: str,
    ours: str = "attnkit.SDPAProcessor",
    theirs: str = "diffusers.AttnProcessor2_0",
) -> str:
    """One summary line of part (a), (b) or (d): both timings, the ratio and its target."""
    s, target = r["seconds_per_call"], TARGETS[part]
    return (
        f"({part}) {what} {ours} {s[ours] * unit:.{time_fmt}}{unit_name}, "
        f"{theirs} {s[theirs] * unit:.{time_fmt}}{unit_name}; "
        f"ratio {r['ratio_median']:.{ratio_fmt}} "
        f"(rounds {r['ratio_min']:.3f}-{r['ratio_max']:.3f}; of minimums {r['ratio_of_minimums']:.{ratio_fmt}}) "
        f"target <= {target}: {'ok' if r['ratio_median'] <= target else 'MISSED'}"
    )


def _launch_cost():
    """bench/launch_cost.py, beside this script."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_cost.py")
    spec = importlib.util.spec_from_file_location("attnkit_bench_launch_cost", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def part_l(device: torch.device, rounds: int, calls: int) -> dict:
    """The launcher's own host time per call (bench/launch_cost.py): on the CPU in a child
    process under Triton's interpreter with the launches recorded, on CUDA here."""
    lc = _launch_cost()
    if device.type == "cpu":
        return lc.run_in_child("cpu", rounds=rounds, calls=calls)
    return lc.measure(str(device), rounds=rounds, calls=calls)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="abcdel", help="which parts to run: any of a, b, c, d, e, l (default abcdel)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--rounds-a", type=int, default=21, help="rounds of part (a)")
    ap.add_argument("--calls-a", type=int, default=50, help="calls per round in part (a)")
    ap.add_argument("--rounds-b", type=int, default=5, help="rounds of part (b)")
    ap.add_argument("--rounds-c", type=int, default=3, help="rounds of part (c)")
    ap.add_argument("--rounds-d", type=int, default=9, help="rounds of part (d)")
    ap.add_argument("--rounds-e", type=int, default=21, help="rounds of part (e)")
    ap.add_argument("--calls-e", type=int, default=200, help="calls per round in part (e)")
    ap.add_argument("--rounds-l", type=int, default=15, help="rounds of part (l)")
    ap.add_argument("--calls-l", type=int, default=200, help="calls per round in part (l)")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        print(json.dumps(_memory_child(args.memory_child, dtype)))
        return 0
    try:
        from diffusers.utils import logging as dlogging

        dlogging.set_verbosity_error()
    except Exception:  # noqa: BLE001
        pass
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, {device.type}, {torch.get_num_threads()} threads, {args.dtype}")
    results = {}
    if "a" in args.parts:
        r = results["a"] = part_a(device, dtype, args.rounds_a, args.calls_a)
        print(_against_diffusers("a", "one Attention module, per call:", r, 1e6, "1f", " us", "3f"))
    if "b" in args.parts:
        r = results["b"] = part_b(device, dtype, args.rounds_b)
        print(_against_diffusers("b", "SD1.5 UNet 32x32 batch 2:", r, 1.0, "3f", " s", "4f"))
    if "c" in args.parts:
        r = results["c"] = part_c(device, dtype, args.rounds_c)
        s, m = r["seconds_per_call"], r["memory"]
        mem = ", ".join(
            f"{n} peak {_mib(v['peak_bytes'])} ({_mib(v['over_baseline_bytes'])} over baseline)"
            for n, v in m.items()
            if "peak_bytes" in v
        )
        print(
            f"(c) 4096 tokens: sliced {s['sliced'] * 1e3:.0f} ms vs vanilla {s['vanilla'] * 1e3:.0f} ms "
            f"(time ratio {r['ratio_median']:.2f}); {mem}"
            + (f"; memory ratio {r['memory_ratio_over_baseline']:.2f}" if "memory_ratio_over_baseline" in r else "")
        )
    if "d" in args.parts:
        results["d"] = part_d(device, args.rounds_d)
        for name, r in results["d"].items():
            print(
                _against_diffusers(
                    "d", f"{name}, per forward:", r, 1.0, "3f", " s", "3f", ours="attnkit", theirs="native"
                )
            )
    if "e" in args.parts:
        results["e"] = part_e(device, dtype, args.rounds_e, args.calls_e)
        for name, r in results["e"].items():
            print(
                _against_diffusers(
                    "e",
                    f"dispatch_attention_fn, {name} call, per call:",
                    r,
                    1e6,
                    "1f",
                    " us",
                    "3f",
                    ours="attnkit",
                    theirs="native",
                )
            )
    if "l" in args.parts:
        results["l"] = part_l(device, args.rounds_l, args.calls_l)
        print("(l) " + _launch_cost().format_result(results["l"]).replace("\n", "\n    "))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
