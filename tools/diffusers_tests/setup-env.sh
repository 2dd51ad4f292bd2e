#!/usr/bin/env bash
# Creates (or refreshes) the virtual environment of `make diffusers-tests`:
#   tools/diffusers_tests/setup-env.sh PROJECT_VENV TESTS_VENV
# TESTS_VENV sees the project's venv (torch, attnkit editable, pytest) through a .pth
# file and the system site-packages as PROJECT_VENV does, and adds only what diffusers'
# tests import (requirements.txt beside this script). The project's venv is never
# changed; torch is constrained to the version it has, so pip never pulls another build.
set -euo pipefail
project=${1:-.venv}
venv=${2:-.venv-diffusers-tests}
here=$(cd "$(dirname "$0")" && pwd)

[ -x "$project/bin/python" ] || { echo "setup: $project/bin/python not found (run make setup first)" >&2; exit 1; }
base=$("$project/bin/python" -c "import sys; print(sys._base_executable)")
if [ ! -x "$venv/bin/python" ]; then
    "$base" -m venv --system-site-packages "$venv"
fi
echo '*' > "$venv/.gitignore"  # keeps git status and ruff (which reads .gitignore) out of it
py="$venv/bin/python"
project_site=$("$project/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# addsitedir, not a bare path: the project's own .pth files (attnkit's editable finder) run too
echo "import site; site.addsitedir('$(cd "$project_site" && pwd)')" > "$site/_attnkit_project_venv.pth"

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
torch=$("$py" -c "import torch; print(torch.__version__.split('+')[0])")
echo "torch==$torch" > "$constraints"
"$py" -m pip install -q -c "$constraints" -r "$here/requirements.txt"
"$py" -c "import torch, transformers, attnkit; print('setup: diffusers tests venv | torch', torch.__version__, '| transformers', transformers.__version__, '| attnkit', attnkit.__file__)"
