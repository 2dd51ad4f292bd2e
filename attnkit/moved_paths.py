"""Module paths attnkit had before its choose/ and diffusers/ packages, importable still.

``import attnkit.chooser``, ``from attnkit.routes import sdpa_mask`` and a pickle that names
``attnkit.chooser.AutoProcessor`` (a processor saved with a model) keep working: each old
path is a module holding every public name the old module had, taken from where that
name lives now.
"""

from __future__ import annotations

import importlib
import sys
import types

# old module -> {module the names live in now: (names, ...)}: every public name each old
# module defined, and the private classes a pickle can name (tests/test_moved_paths.py).
MOVED: dict[str, dict[str, tuple[str, ...]]] = {
    "attnkit._compile": {"attnkit.choose.compiling": ("CompileOwner", "F", "compile_owner", "mark_compile_constant")},
    "attnkit._text": {"attnkit.text": ("Caller", "describe_exception", "describe_module", "short")},
    "attnkit.choose._compile": {
        "attnkit.choose.compiling": ("CompileOwner", "F", "compile_owner", "is_compiling", "mark_compile_constant")
    },
    "attnkit.apply": {
        "attnkit.diffusers.apply": (
            "Applied",
            "AppliedPipeline",
            "PROCESSOR_NAMES",
            "apply",
            "attention_modules",
            "plan",
            "processor",
        ),
        "attnkit.diffusers.wrappers": ("install_backend_warning", "unreached_by_dispatch"),
    },
    "attnkit.binding": {
        "attnkit.diffusers.binding": (
            "KEEP_HINT",
            "QUIET",
            "SERVE",
            "STOCK",
            "accepted_keywords",
            "current_processor",
            "default_stock",
            "dispatch_copy",
            "forget",
            "is_attnkit",
            "keep_accepted",
            "protect_pickle",
            "protocol_fits",
            "record",
            "served_by",
            "stock_of",
            "undo",
        ),
        "attnkit.diffusers.hooks": ("install",),
    },
    "attnkit.chooser": {
        "attnkit.choose.auto": ("AUTO_OPTIONS", "AutoChooser", "_Slot", "ENV_VAR"),
        "attnkit.choose.decision": ("Decision", "format_decision", "log_line"),
        "attnkit.diffusers.processor": ("AutoProcessor", "auto"),
    },
    "attnkit.diffusers_backend": {
        "attnkit.diffusers.backend": (
            "_ChooserHolder",
            "_EveryName",
            "DISPATCH_WHO",
            "KNOWN_ARGS",
            "PREFIX",
            "PROBLEM",
            "attention",
            "check_qkv",
            "mask_to_bias",
            "member_for",
            "prepare",
            "register_defaults",
            "registered_names",
            "require",
        ),
        "attnkit.errors": ("DiffusersBackendUnavailable",),
        "attnkit.masks": ("expand_kv_heads",),
    },
    "attnkit.parallel.diffusers_cp": {
        "attnkit.diffusers.context_parallel": ("WHO", "context_parallel", "enable_parallelism", "local_attention_for")
    },
    "attnkit.policy": {
        "attnkit.choose.auto": ("CANDIDATES", "LOCK"),
        "attnkit.choose.policy": (
            "CLASS_EXAMPLES",
            "EXCLUDED",
            "LAST_RESORT",
            "PACKAGES",
            "PRIORITIES",
            "Priority",
            "choose",
            "default_backend",
            "describe_call",
            "hardware_class",
            "install_hint_of",
            "installed_packages",
            "make_backend",
            "no_backend_error",
            "priority_for",
            "priority_table",
            "reasons_of",
            "validate_labels",
            "walk",
        ),
    },
    "attnkit.processor": {
        "attnkit.choose.fixed": (
            "Chooser",
            "ChooserBase",
            "FixedChooser",
            "call_flags",
            "check_finite_on",
            "finite_checked",
            "run_backend",
        ),
        "attnkit.diffusers.apply": ("PROCESSORS",),
        "attnkit.diffusers.processor": (
            "AttnkitProcessor",
            "FlashAttnProcessor",
            "SDPAProcessor",
            "SlicedProcessor",
            "TritonProcessor",
            "VanillaProcessor",
            "XFormersProcessor",
        ),
    },
    "attnkit.protocol": {
        "attnkit.text": ("Caller", "describe_module"),
        "attnkit.choose.fixed": ("CHECK_FINITE_VAR",),
        "attnkit.diffusers.processor": ("APPLY_HINT", "PROCESSOR_ARGUMENTS"),
        "attnkit.diffusers.protocol": ("advertised_signature", "check_module", "check_module_problem", "prepare_bias"),
        "attnkit.errors": ("UnsupportedModule",),
    },
    "attnkit.routes": {
        "attnkit.diffusers.adapters": ("SDPA_WHO", "functional_for", "nn_for", "sdpa_call", "sdpa_mask"),
        "attnkit.diffusers.routes": (
            "DISPATCH",
            "FORWARD_ADAPTERS",
            "METHODS",
            "Route",
            "SDPA",
            "bind_module",
            "bound_processor",
            "classify",
            "classify_forward",
        ),
    },
    "attnkit.tuning": {
        "attnkit.choose.cache_files": ("CacheNotWritten", "NotRegularFile"),
        "attnkit.choose.tune_cache": (
            "CACHE_VERSION",
            "CacheError",
            "LOCK_TIMEOUT_S",
            "STALE_TMP_S",
            "cache_key",
            "default_cache_path",
            "read_cache",
            "read_raw",
            "update_cache",
            "valid_entry",
        ),
        "attnkit.choose.tune_check": ("time_backend",),
    },
}


def install() -> None:
    """Register each old path as a module of the names it had (at import of attnkit; its
    new homes are imported by then). attnkit.processor and attnkit.apply stay the
    functions: their old modules are reached by import only."""
    for old, homes in MOVED.items():
        if old in sys.modules:
            continue
        module = types.ModuleType(old, f"attnkit's former module {old}: its names, from where they live now.")
        for home, names in homes.items():
            new = importlib.import_module(home)
            for name in names:
                setattr(module, name, getattr(new, name))
        module.__all__ = sorted(n for names in homes.values() for n in names)
        sys.modules[old] = module
        parent, _, child = old.rpartition(".")
        if not hasattr(sys.modules[parent], child):
            setattr(sys.modules[parent], child, module)
