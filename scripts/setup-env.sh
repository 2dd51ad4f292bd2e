#!/usr/bin/env bash
# Creates (or refreshes) the virtual environment used by `make test` and `make bench`.
#   scripts/setup-env.sh VENV EXTRAS
# - keeps a torch that is already importable (system site-packages are visible);
# - otherwise installs torch: the CPU build 2.13.0 where no NVIDIA GPU is present
#   (an unpinned `torch` would pull several GB of CUDA packages), the default build
#   where one is;
# - installs attnkit in editable mode with EXTRAS, under constraints.txt.
set -euo pipefail
venv=${1:-.venv}
extras=${2:-test}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv --system-site-packages "$venv"
fi
py="$venv/bin/python"
pip=("$py" -m pip install -q)

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
if "$py" -c "import torch" >/dev/null 2>&1; then
    have=$("$py" -c "import torch; print(torch.__version__.split('+')[0])")
    pinned=$(sed -n 's/^torch==//p' constraints.txt)
    if [ "$have" != "$pinned" ]; then
        echo "setup: keeping the installed torch $have (constraints pin $pinned; not replacing it)"
        grep -v -E '^(torch|triton)==' constraints.txt > "$constraints"
    else
        cp constraints.txt "$constraints"
    fi
else
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        echo "setup: no torch found, NVIDIA GPU present: installing the default (CUDA) torch"
        "${pip[@]}" torch
        grep -v -E '^(torch|triton)==' constraints.txt > "$constraints"
    else
        pinned=$(sed -n 's/^torch==//p' constraints.txt)
        echo "setup: no torch found and no NVIDIA GPU: installing the CPU build torch==$pinned"
        "${pip[@]}" "torch==$pinned"
        cp constraints.txt "$constraints"
    fi
fi

"${pip[@]}" -c "$constraints" -e ".[$extras]"
"$py" -c "import attnkit, torch, diffusers; print('setup: attnkit', attnkit.__version__, '| torch', torch.__version__, '| diffusers', diffusers.__version__)"
