"""Host time of the flash-attention launcher per call: everything attnkit does on the
host for one call of attnkit.kernels.flash_attention, at a small shape where that is
all that matters (SD1.5's cross-attention at 8x8 latents: batch 2, 8 heads, 64 queries,
77 keys, head dim 40, fp16).

    python bench/launch_cost.py                 # CPU: the launches replaced by a recorder
    python bench/launch_cost.py --device cuda   # GPU: real launches, against SDPA
    python bench/overhead.py --parts l          # the same, as part (l) of overhead.py

On the CPU the kernels run under Triton's interpreter, far slower than a GPU, so the
launches themselves are replaced by a recorder (a stand-in for Triton's compiled
kernel that counts its launches and their arguments): the time measured is the
launcher's own, from the checks to the argument list handed to the launch, on the
path a GPU takes after the first call of a signature (the tiles, TMA descriptors and
direct launch of an sm_90 target, which the interpreter follows). Targets: forward
<= 10 us on the CPU; on a GPU, forward <= 25 us and forward + backward <= 150 us of
host time.

On CUDA each call is timed as host time: calls are issued back to back and the GPU
work of a call this small is shorter than its launch, so the loop runs at the host's
pace (the GPU is synchronised only at the ends of a round). SDPA runs interleaved with
it for scale. Rounds alternate the order; each figure is the median over rounds.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
import types

TARGETS_US = {"cpu": {"forward": 10.0}, "cuda": {"forward": 25.0, "forward+backward": 150.0}}
SHAPE = (2, 8, 64, 77, 40)  # B, H, M, N, D


class Recorder:
    """A stand-in for a compiled Triton kernel: its launcher takes the kernel's arguments
    in their declared order (as Triton's does) and only counts them, and what Triton's
    launcher would pack of them: every argument but the constexprs and the None ones
    (compile-time constants), and of those the tensors and tensor descriptors (a
    pointer each, read from the object on every call)."""

    def __init__(self, jit):
        self.src = types.SimpleNamespace(fn=jit)
        self.function = self.packed_metadata = None
        self.launches = 0
        self.arguments = len(jit.arg_names)
        self.kernel = jit.fn.__name__
        # (Triton's JITFunction knows its constexprs; the interpreter's function only its
        # signature, which the constexprs are annotated in.)
        params = inspect.signature(jit.fn).parameters.values()
        self.constexpr = [
            p.annotation in ("tl.constexpr", "constexpr") or "constexpr" in str(p.annotation) for p in params
        ]
        self.packed = self.tensors = None

    def run(self, g0, g1, g2, stream, function, metadata, launch_metadata, enter, exit_, *values):
        assert len(values) == self.arguments, (len(values), self.arguments)
        self.launches += 1
        if self.packed is None:  # counted once: a launch plan passes the same kinds every call (not timed)
            packed = [v for v, c in zip(values, self.constexpr) if not c and v is not None]
            self.packed = len(packed)
            self.tensors = sum(1 for v in packed if hasattr(v, "data_ptr") or hasattr(v, "base"))


def _install_recorder(launcher) -> list:
    """Triton's launches replaced by Recorders for the rest of the process (settings
    launch_through: the first launch of each plan returns one, which later launches run)."""
    recorders = []

    def record(fn, grid, kwargs):
        jit = fn if hasattr(fn, "arg_names") and not hasattr(fn, "configs") else fn.fn
        recorders.append(Recorder(jit))
        return recorders[-1]

    global _FORCED
    _FORCED = launcher.override(launch_through=record)  # kept referenced: see _large_offsets
    _FORCED.__enter__()
    return recorders


_FORCED = None


def _timed(fns: dict, rounds: int, calls: int, sync) -> dict:
    names = list(fns)
    for name in names:
        for _ in range(3):
            fns[name]()
    sync()
    times = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            sync()
            start = time.perf_counter()
            for _ in range(calls):
                fns[name]()
            sync()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    return times


def measure(device: str = "cpu", rounds: int = 15, calls: int = 200) -> dict:
    """Per-call host time (us) of the launcher, in this process. On the CPU, Triton's
    interpreter must have been switched on before attnkit.kernels was imported."""
    import torch

    from attnkit.kernels import flash_attention, launcher

    dev = torch.device(device)
    recorders = _install_recorder(launcher) if dev.type == "cpu" else None
    if dev.type == "cpu" and not launcher.INTERPRETED:
        raise RuntimeError("on the CPU, run with TRITON_INTERPRET=1 set before attnkit is imported")
    B, H, M, N, D = SHAPE
    torch.manual_seed(0)
    q = torch.randn(B, H, M, D, device=dev, dtype=torch.float16)
    k, v = (torch.randn(B, H, N, D, device=dev, dtype=torch.float16) for _ in range(2))
    mask = torch.ones(B, 1, 1, N, dtype=torch.bool, device=dev)
    mask[0, ..., 60:] = False  # text of 60 tokens padded to 77
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    grad = torch.randn_like(q)

    def forward():  # q, k, v need no gradient: the inference path
        flash_attention(q, k, v)

    def forward_mask():
        flash_attention(q, k, v, mask)

    def forward_backward():
        out = flash_attention(qg, kg, vg)
        torch.autograd.grad(out, (qg, kg, vg), grad)

    fns = {"forward": forward, "forward, key-padding mask": forward_mask, "forward+backward": forward_backward}
    if dev.type == "cuda":
        fns["sdpa forward"] = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    times = _timed(fns, rounds, calls, sync)
    out = {
        "setting": f"B, H, M, N, D = {SHAPE}, fp16, {dev.type}"
        + (" (Triton's interpreter path, launches recorded)" if dev.type == "cpu" else ""),
        "us_per_call": {n: statistics.median(t) for n, t in times.items()},
        "us_min": {n: min(t) for n, t in times.items()},
        "rounds": rounds,
        "calls": calls,
        "targets_us": TARGETS_US[dev.type],
    }
    if recorders is not None:
        # Every call after a signature's first reached the recorder with a full argument list.
        out["recorded_launches"] = sum(r.launches for r in recorders)
        assert out["recorded_launches"] > 0, "no launch took the direct path"
        # What the launcher packs per launch, each kernel signature once (in call order).
        out["packed_arguments"] = [
            dict(kernel=r.kernel, declared=r.arguments, packed=r.packed, tensors=r.tensors)
            for r in recorders
            if r.packed is not None
        ]
    out["met"] = {n: out["us_per_call"][n] <= t for n, t in out["targets_us"].items()}
    return out


def run_in_child(device: str = "cpu", rounds: int = 15, calls: int = 200) -> dict:
    """measure() in a fresh process (on the CPU with Triton's interpreter switched on)."""
    env = dict(os.environ)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--device",
            device,
            "--rounds",
            str(rounds),
            "--calls",
            str(calls),
            "--json",
            "-",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    if res.returncode != 0:
        raise RuntimeError(f"bench/launch_cost.py failed (exit {res.returncode}):\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def format_result(result: dict) -> str:
    lines = [f"launcher host time per call: {result['setting']}"]
    for name, us in result["us_per_call"].items():
        target = result["targets_us"].get(name)
        mark = "" if target is None else f"  (target <= {target:g} us: {'met' if us <= target else 'NOT met'})"
        lines.append(f"  {name:<28} {us:8.1f} us  (min {result['us_min'][name]:.1f}){mark}")
    if result.get("packed_arguments"):
        lines.append("arguments each launch packs (of those declared), tensors and descriptors among them:")
        for a in result["packed_arguments"]:
            lines.append(f"  {a['kernel']:<28} {a['packed']:3d} of {a['declared']:3d}, {a['tensors']} tensors")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--json", help="write the result as JSON here ('-': the last line of stdout)")
    args = ap.parse_args(argv)
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        result = run_in_child(args.device, args.rounds, args.calls)
    else:
        result = measure(args.device, args.rounds, args.calls)
    if args.json == "-":
        print(json.dumps(result))
        return 0
    print(format_result(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
