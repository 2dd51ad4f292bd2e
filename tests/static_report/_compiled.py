"""A process of the tool's own, without TRITON_INTERPRET: the kernels are defined for
Triton's compiler there, not for the interpreter the test session runs them in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def compiled_run(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """``python ARGS`` in the repository, without TRITON_INTERPRET: its output as text."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
