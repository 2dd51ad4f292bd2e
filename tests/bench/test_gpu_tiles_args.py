"""bench/gpu_tiles.py's command line and the choice of timing cases, without a GPU: the
quick suite's tile-timing step names cases of TIMING, which must stay valid names."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_tiles.py"


@pytest.fixture(scope="module")
def gpu_tiles():
    spec = importlib.util.spec_from_file_location("bench_gpu_tiles", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_defaults_time_every_case_with_the_host_time(gpu_tiles):
    args = gpu_tiles.parse_args(["out"])
    assert args.outdir == "out" and args.timing_case is None and not args.no_host and not args.skip_tiles
    assert args.timing_seconds == 90
    assert gpu_tiles.timing_cases(args.timing_case) == gpu_tiles.TIMING


def test_timing_cases_are_named_exactly_and_kept_in_the_tables_order(gpu_tiles):
    args = gpu_tiles.parse_args(
        [
            "out",
            "--skip-tiles",
            "--no-host",
            "--timing-seconds",
            "25",
            "--timing-case",
            "d128 full bias",
            "--timing-case",
            "sd15 d40",
            "--timing-case",
            "d64",
            "--timing-case",
            "d128",
        ]
    )
    assert args.skip_tiles and args.no_host and args.timing_seconds == 25
    assert args.timing_case == ["d128 full bias", "sd15 d40", "d64", "d128"]
    chosen = gpu_tiles.timing_cases(args.timing_case)
    assert [c[0] for c in chosen] == ["sd15 d40", "d128", "d64", "d128 full bias"]  # TIMING's order
    assert all(c in gpu_tiles.TIMING for c in chosen)


@pytest.mark.parametrize("name", ["nope", "D128", "d128 ", "sd15"])
def test_an_unknown_timing_case_is_an_error_that_lists_the_cases(gpu_tiles, capsys, name):
    with pytest.raises(SystemExit) as exc:
        gpu_tiles.parse_args(["out", "--timing-case", "d64", "--timing-case", name])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--timing-case" in err and repr(name) in err
    assert all(repr(n) in err for n in gpu_tiles.TIMING_NAMES), err
    with pytest.raises(ValueError, match="no timing case named"):
        gpu_tiles.timing_cases([name])


def test_a_sigint_keeps_the_cases_measured_and_the_autotuners_choices(gpu_tiles, monkeypatch):
    """timing() on the named cases only; a KeyboardInterrupt (the suite's SIGINT before its
    KILL) in the second case ends the pass, the cases left are marked, and the autotuned
    pass still logs what the autotuner chose."""
    timed = []

    def time_case(rows, autotune, name, *shape):
        if len(timed) == 1:
            raise KeyboardInterrupt
        timed.append(name)
        rows.append({"case": name, "autotune": autotune, "attnkit_ms": 1.0})

    class Launch:
        @staticmethod
        def tuner_choices():  # per tuner, per length bucket
            return {("sm90", "fwd"): {(64, 4096, 4096, False): "BLOCK_M=128"}}

        @staticmethod
        def clear_plans():
            pass

    monkeypatch.setattr(gpu_tiles, "time_case", time_case)
    monkeypatch.setattr(gpu_tiles, "select_module", lambda: Launch)
    monkeypatch.setenv("ATTNKIT_TRITON_AUTOTUNE", "0")
    monkeypatch.setenv("ATTNKIT_TILE_RECORDS", "1")
    rows = gpu_tiles.timing("out", 60, autotune=True, cases=["d128", "sd15 d40", "d64"])
    assert timed == ["sd15 d40"]
    assert rows[0] == {"case": "sd15 d40", "autotune": True, "attnkit_ms": 1.0}
    assert rows[1:3] == [
        {"case": "d128", "skipped": gpu_tiles.INTERRUPTED},
        {"case": "d64", "skipped": gpu_tiles.INTERRUPTED},
    ]
    assert rows[3] == {"case": "autotuner choices", "choices": {"sm90/fwd": {"(64, 4096, 4096, False)": "BLOCK_M=128"}}}
    assert len(rows) == 4


def test_the_autotuned_share_of_the_timing(gpu_tiles, capsys):
    assert gpu_tiles.parse_args(["out"]).autotune_share == 0.3
    assert gpu_tiles.parse_args(["out", "--autotune-share", "0.65"]).autotune_share == 0.65
    for bad in ("0", "1", "1.5"):
        with pytest.raises(SystemExit) as exc:
            gpu_tiles.parse_args(["out", "--autotune-share", bad])
        assert exc.value.code == 2
        assert f"--autotune-share {float(bad)}: must be between 0 and 1" in capsys.readouterr().err


def test_what_the_script_reads_of_attnkit_exists(gpu_tiles):
    """The GPU-only parts of the script (host time, tile sweeps) run on no CPU test: every
    name they read of attnkit's modules exists, so a rename inside attnkit cannot leave
    them broken until a GPU is lent. Read from the source: `from attnkit... import name`,
    and attributes of select_module() or importlib.import_module("attnkit..."), called
    directly or through a variable bound to the call."""
    import ast
    import importlib

    tree = ast.parse(SCRIPT.read_text(encoding="utf-8"))

    def module_of(call: ast.AST) -> str | None:
        if not isinstance(call, ast.Call):
            return None
        name = getattr(call.func, "id", getattr(call.func, "attr", ""))
        if name == "select_module":
            return "attnkit.kernels.flash.select"
        if name == "import_module" and call.args and isinstance(call.args[0], ast.Constant):
            return str(call.args[0].value) if str(call.args[0].value).startswith("attnkit") else None
        return None

    bound = {}  # variable -> the attnkit module a call bound it to
    read = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and module_of(node.value):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    bound[t.id] = module_of(node.value)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnkit"):
            read += [(node.module, a.name) for a in node.names]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            target = module_of(node.value) or (isinstance(node.value, ast.Name) and bound.get(node.value.id))
            if target:
                read.append((target, node.attr))
    names = {f"{m}.{a}" for m, a in read}
    assert {
        "attnkit.kernels.launcher.clear_plans",
        "attnkit.kernels.flash.select.configs_for",
        "attnkit.kernels.launcher.override",
    } <= names, sorted(names)

    def exists(module: str, attr: str) -> bool:
        found = importlib.import_module(module)
        if hasattr(found, attr):
            return True
        try:
            importlib.import_module(f"{module}.{attr}")
        except ImportError:
            return False
        return True

    missing = sorted(f"{m}.{a}" for m, a in read if not exists(m, a))
    assert not missing, missing
    assert gpu_tiles.select_module() is importlib.import_module("attnkit.kernels.flash.select")
