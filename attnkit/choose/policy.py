"""Which backend auto() takes: the candidates, the priority list of each hardware class,
and the one walk over a list that every caller uses.

A call is described by an :class:`~attnkit.backends.AttentionCall` (device and CUDA
compute capability, dtype, head dim, lengths, mask kind, grad, causal, dropout, LSE,
determinism, installed packages). The device's hardware class (:func:`hardware_class`)
names a priority list (:data:`PRIORITIES`, each written down with the reason for its
order), and :func:`walk` takes the first backend of the list whose
``not_supported_reasons`` is empty. The walk is a pure function of the described call,
so the choice for an H100 with flash-attn installed can be asked for (and tested) on a
laptop. :func:`choose`, auto()'s per-call decision, its fallback, its compile-time
choice, ``explain()`` and ``attnkit info`` all go through :func:`walk`.

A GPU with a committed record (``bench/results/<gpu>/``, matched by device name and
compute capability) also has rules generated from it (:mod:`attnkit.choose.gpu_rules`,
``python -m tools.records``): where the record measured attnkit's Triton kernel ahead
of SDPA for a class of calls (key-padding mask, fp16, head dim 128 on the H100, ...),
:func:`walk` moves it ahead of SDPA in the hardware class's order for calls of that
class (:mod:`attnkit.choose.record_rules`: which rules cover a call, and how they move
a backend). The walk still takes the first backend that can run, so a rule never picks
what cannot. An order given by the caller is never adjusted, and a GPU without a record
keeps its class's order. :func:`describe_call` names the record behind a call's rule, so
logs, errors and ``explain()`` show it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..backends import AttentionCall, Backend, BackendUnavailable, DeviceInfo, get_backend
from ..backends.base import dtype_name, package_version
from .record_rules import apply_rules, describe_rule, rules_for, rules_table

# What auto() can choose: label -> (registered backend name, constructor options).
CANDIDATES: dict[str, tuple[str, dict[str, Any]]] = {
    "flash_attn3": ("flash_attn", {"version": 3}),
    "flash_attn": ("flash_attn", {}),
    "sdpa": ("sdpa", {}),
    "triton": ("triton", {}),
    "xformers": ("xformers", {}),
    "sliced": ("sliced", {}),
    "vanilla": ("vanilla", {}),
}

# Never a first choice: they hold the whole score matrix (per slice). Last in every list
# so that auto() can always run; sliced before vanilla because a fused kernel that fails
# at run time has most often run out of memory, and sliced needs the least.
LAST_RESORT = ("sliced", "vanilla")

# Every package a backend may need (distribution names), for the installed snapshot.
PACKAGES = ("xformers", "flash_attn", "flash_attn_3", "flashattn-hopper", "triton")


class ClassOrder(tuple):
    """A hardware class's order (:data:`PRIORITIES`): :func:`walk` adjusts it per call by
    the rules of the device's GPU record. An order a caller gives (``auto(order=...)``)
    is a plain tuple and is walked as given."""

    __slots__ = ()


@dataclass(frozen=True)
class Priority:
    """One hardware class's order of backends and why it is that order."""

    order: tuple[str, ...]
    why: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", ClassOrder(self.order))


_HOST = Priority(
    ("sdpa",) + LAST_RESORT,
    "torch's SDPA has fused kernels here for every float dtype, head dim and mask, with "
    "memory linear in the sequence. triton, xformers and flash_attn have no kernel for "
    "this device (triton's CPU interpreter is for tests only and never chosen).",
)

PRIORITIES: dict[str, Priority] = {
    "sm_90": Priority(
        ("flash_attn3", "flash_attn", "sdpa", "triton", "xformers") + LAST_RESORT,
        "Hopper (H100/H200/H20/GH200). FlashAttention-3 is written for Hopper's TMA and "
        "warpgroup MMA and is the fastest maskless kernel there; FlashAttention-2 as "
        "installed is at least as new as the copy torch vendors. SDPA next: its cuDNN / "
        "flash / memory-efficient kernels take every dtype and mask. attnkit's triton "
        "kernel comes after SDPA until the benchmark measures it ahead on this class "
        "(tune=True times it on your shapes). xformers last of the fused kernels: on "
        "sm_80+ it dispatches to the same FlashAttention-2/CUTLASS kernels SDPA vendors, "
        "behind an extra layout and bias conversion.",
    ),
    "sm_80": Priority(
        ("flash_attn", "sdpa", "triton", "xformers") + LAST_RESORT,
        "A100/A800/A30 (164 KB shared memory per SM). FlashAttention-2 is at home here; "
        "SDPA's flash kernel is a vendored FlashAttention-2, so it is a close second and "
        "also takes masks and fp32. triton after SDPA until measured on this class (this is "
        "the first class to reorder once the benchmark shows it ahead). xformers as on "
        "sm_90.",
    ),
    "sm_86-89": Priority(
        ("flash_attn", "sdpa", "xformers", "triton") + LAST_RESORT,
        "Consumer and inference Ampere/Ada (RTX 30xx/40xx, A10, A40, L4, L40): 100 KB of "
        "shared memory per SM instead of A100's 164 KB. FlashAttention-2 and SDPA ship "
        "tiles tuned for it; xformers' CUTLASS kernel too. attnkit's triton tiles fit the "
        "99 KB (the inspector checks the first sm_80 candidate against it) but are "
        "unmeasured on these GPUs, so it comes last of the fused kernels.",
    ),
    "sm_75-": Priority(
        ("xformers", "sdpa", "triton") + LAST_RESORT,
        "Turing, Volta, Pascal (T4, V100, P100, RTX 20xx): no FlashAttention (it needs "
        "sm_80). xformers' CUTLASS memory-efficient kernel was written for these GPUs "
        "(sm_50+) and is what SDPA's memory-efficient kernel vendors, usually in an older "
        "version, so xformers first where installed, SDPA otherwise; triton last of the "
        "fused kernels (its tensor-core code targets sm_80+).",
    ),
    "sm_100+": Priority(
        ("sdpa", "flash_attn", "triton", "xformers") + LAST_RESORT,
        "Blackwell and newer (B200, RTX 50xx): torch's SDPA (cuDNN) has native kernels; "
        "FlashAttention-2/3 and attnkit's triton tiles were built and tuned for sm_80/sm_90.",
    ),
    "cuda": Priority(
        ("sdpa", "flash_attn", "xformers", "triton") + LAST_RESORT,
        "CUDA device of unknown compute capability: SDPA, which chooses its own kernel per call, first.",
    ),
    "rocm": Priority(
        ("sdpa",) + LAST_RESORT,
        "AMD GPUs (ROCm): SDPA runs AOTriton/CK flash kernels; attnkit's triton kernel and "
        "the xformers/flash_attn backends are tested on NVIDIA GPUs only.",
    ),
    "cpu": _HOST,
    "mps": _HOST,
    "xpu": _HOST,
    "other": _HOST,
}

# What each hardware class stands for, for tables (README, `attnkit info`).
CLASS_EXAMPLES = {
    "sm_90": "H100/H200",
    "sm_80": "A100",
    "sm_86-89": "RTX 30xx/40xx, A10, L4, L40",
    "sm_75-": "T4, V100 and older",
    "sm_100+": "Blackwell",
    "cuda": "CUDA, capability unknown",
    "rocm": "AMD (ROCm)",
    "cpu": "CPU",
    "mps": "Apple (MPS)",
    "xpu": "Intel (XPU)",
    "other": "any other device",
}


def hardware_class(device: DeviceInfo) -> str:
    """The key of :data:`PRIORITIES` for a device."""
    if device.type != "cuda":
        return device.type if device.type in ("cpu", "mps", "xpu") else "other"
    name = (device.name or "").lower()
    if any(word in name for word in ("amd", "radeon", "instinct")):
        return "rocm"
    cap = device.capability
    if cap is None:
        return "cuda"
    major_minor = tuple(cap)  # a list where a DeviceInfo was read from JSON
    if major_minor >= (10, 0):
        return "sm_100+"
    if major_minor >= (9, 0):
        return "sm_90"
    if major_minor == (8, 0):
        return "sm_80"
    if major_minor >= (8, 0):
        return "sm_86-89"
    return "sm_75-"


def priority_for(device: DeviceInfo) -> tuple[str, Priority]:
    cls = hardware_class(device)
    return cls, PRIORITIES[cls]


def priority_table() -> str:
    """:data:`PRIORITIES` as a markdown table (it is in the README, kept equal by a test)."""
    rows = ["| class | devices | order |", "|---|---|---|"]
    seen: dict[tuple[str, ...], list[str]] = {}
    for cls, priority in PRIORITIES.items():
        seen.setdefault(priority.order, []).append(cls)
    for order, classes in seen.items():
        names = ", ".join(CLASS_EXAMPLES[c] for c in classes)
        rows.append(f"| {', '.join(classes)} | {names} | {' > '.join(order)} |")
    return "\n".join(rows)


# -- the order of a call: its hardware class's, with the device's record rules applied --------
def order_for(call: AttentionCall) -> tuple[str, tuple[str, ...]]:
    """(name, order) auto() walks for ``call`` without an order of its own: the hardware
    class's order with the device's record rules applied; the name is the class, with the
    record of each rule that moved a backend ("sm_90 + triton ahead of sdpa: ...")."""
    cls, priority = priority_for(call.device)
    order, applied = apply_rules(call, priority.order)
    return cls + "".join(f" + {describe_rule(r)}" for r in applied), order


# -- installed packages and backend instances -------------------------------------------
# the optional packages' versions, read once (installed_packages(refresh=True) reads again), and
# one backend instance per CANDIDATES label (bounded by it; an import error is kept as its answer)
_PACKAGES_SNAPSHOT: dict[str, str | None] | None = None
_DEFAULT_BACKENDS: dict[str, Backend | Exception] = {}
LOCK = threading.RLock()


def installed_packages(refresh: bool = False) -> dict[str, str | None]:
    """Versions of the optional packages (None: not installed), looked up once."""
    global _PACKAGES_SNAPSHOT
    if _PACKAGES_SNAPSHOT is None or refresh:
        _PACKAGES_SNAPSHOT = {name: package_version(name) for name in PACKAGES}
    return dict(_PACKAGES_SNAPSHOT)


def make_backend(label: str, options: Mapping[str, Any] | None = None) -> Backend | Exception:
    """The candidate ``label`` with its options, or the exception that stopped it (a
    module that does not import, bad options): auto() reports it as a reason."""
    name, base = CANDIDATES[label]
    try:
        return get_backend(name, **{**base, **(options or {})})
    except Exception as e:
        return e


def default_backend(label: str) -> Backend | Exception:
    """The candidate ``label`` with default options, made once per process."""
    with LOCK:
        backend = _DEFAULT_BACKENDS.get(label)
        if backend is None:
            backend = _DEFAULT_BACKENDS[label] = make_backend(label)
        return backend


def reasons_of(backend: Backend | Exception, call: AttentionCall) -> list[str]:
    """Why ``backend`` cannot serve ``call`` (empty: it can). Never raises."""
    if isinstance(backend, Exception):
        return [f"could not be loaded ({type(backend).__name__}: {backend})"]
    try:
        return list(backend.not_supported_reasons(call))
    except Exception as e:  # a backend's own check must never take auto() down
        return [f"its capability check raised {type(e).__name__}: {e}"]


def install_hint_of(backend: Backend | Exception, call: AttentionCall) -> str | None:
    if isinstance(backend, Exception):
        return None
    try:
        return backend.install_hint(call)
    except Exception:
        return None


def validate_labels(labels: Iterable[str], what: str) -> tuple[str, ...]:
    labels = tuple(labels)
    unknown = [x for x in labels if x not in CANDIDATES]
    if unknown:
        raise ValueError(
            f"{what}: unknown backend(s) {', '.join(map(repr, unknown))}; choose from {', '.join(CANDIDATES)}"
        )
    return labels


EXCLUDED = "excluded"


def walk(
    call: AttentionCall,
    order: Sequence[str],
    backend_for: Callable[[str], Backend | Exception] = default_backend,
    exclude: Iterable[str] = (),
    failed: Mapping[str, str] | None = None,
) -> tuple[str | None, dict[str, list[str]]]:
    """Walk ``order`` and take the first backend that can serve ``call``.

    Returns (label or None, table): the table maps every candidate of the order, in
    order, to its reasons (empty: it can run). A hardware class's order
    (:class:`ClassOrder`) is first adjusted by the device's record rules
    (:func:`apply_rules`); any other order is walked as given. ``exclude``d candidates read "excluded";
    ``failed`` ones (label -> what they raised at run time) read "failed at run time".
    """
    if isinstance(order, ClassOrder):
        order = apply_rules(call, order)[0]
    excluded = frozenset(exclude)
    failed = failed or {}
    table: dict[str, list[str]] = {}
    chosen = None
    for label in order:
        if label in excluded:
            table[label] = [EXCLUDED]
        elif label in failed:
            table[label] = [f"failed at run time ({failed[label]})"]
        else:
            table[label] = reasons_of(backend_for(label), call)
        if chosen is None and not table[label]:
            chosen = label
    return chosen, table


def choose(
    call: AttentionCall,
    order: Sequence[str] | None = None,
    exclude: Iterable[str] = (),
    backends: Mapping[str, Backend | Exception] | None = None,
) -> tuple[str, dict[str, list[str]]]:
    """The backend auto() picks for ``call``, and why every candidate can or cannot run.

    ``order`` defaults to the call's hardware class list; ``exclude`` removes
    candidates; ``backends`` supplies instances (default: each with default options).
    Raises BackendUnavailable, listing every reason, when no candidate can run.
    """
    if order is None:
        order = priority_for(call.device)[1].order
    backends = backends or {}
    label, table = walk(call, order, lambda x: backends.get(x) or default_backend(x), exclude)
    if label is None:
        raise no_backend_error(f"no attention backend can serve {describe_call(call)}", table)
    return label, table


def no_backend_error(what: str, table: Mapping[str, list[str]]) -> BackendUnavailable:
    return BackendUnavailable(f"{what}: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in table.items()), reasons=table)


def describe_call(call: AttentionCall, with_record: bool = True) -> str:
    """One line: "cuda sm_90 float16 D=40 M=4096 N=77 mask=key_padding grad", and where a
    GPU record's rule covers the call, the rule and its record ("[record: triton ahead
    of sdpa: 1.84x in bench/results/nvidia-h100-80gb-hbm3/timing/timing.json#18]")."""
    dev = call.device.type
    if call.device.capability is not None:
        dev += " sm_" + "".join(map(str, call.device.capability))
    lengths = " any M, N" if call.q_len is None else f" M={call.q_len} N={call.kv_len}"
    flags = [
        name
        for name, on in (
            ("grad", call.requires_grad),
            ("causal", call.causal),
            ("dropout", call.dropout),
            ("lse", call.lse),
        )
        if on
    ]
    return (
        f"{dev} {dtype_name(call.dtype)} D={call.head_dim}{lengths} mask={call.mask}"
        + "".join(" " + f for f in flags)
        + ("".join(f" [record: {describe_rule(r)}]" for r in rules_for(call)) if with_record else "")
    )


__all__ = [
    "CANDIDATES",
    "CLASS_EXAMPLES",
    "ClassOrder",
    "LAST_RESORT",
    "PRIORITIES",
    "Priority",
    "choose",
    "default_backend",
    "describe_call",
    "hardware_class",
    "installed_packages",
    "order_for",
    "priority_for",
    "priority_table",
    "rules_table",  # attnkit.choose.record_rules' (the docs named it here)
    "walk",
]
