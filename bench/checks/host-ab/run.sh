#!/usr/bin/env bash
# The host-time A/B recorded in bench/results/nvidia-h100-80gb-hbm3/host-ab-2bb37ee/ (2bb37ee's
# launcher against 634c0ee's): on a CUDA machine, host_ab.py in one process per launcher
# version, in the order new, old, new, old; one JSON line per process on stdout.
#
#   bench/checks/host-ab/run.sh OLD_COMMIT > host_ab.jsonl     # e.g. 634c0ee
#
# "new" is this checkout's attnkit; "old" the same attnkit with the kernels of OLD_COMMIT
# (read with git, so the checkout's .git must be there). Needs torch, triton and attnkit's
# own dependencies importable; attnkit is staged from the checkout as bench/gpu_suite.sh
# stages it. Environment: TH0 (the first process's time limit, default 130 s), TH (the
# others', default 45 s). Steps go to stderr.
set -u
[ $# -eq 1 ] || { echo "usage: $0 OLD_COMMIT" >&2; exit 2; }
OLD=$1
REPO=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$REPO/bench/checks/host-ab
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
T=$(mktemp -d "${TMPDIR:-/tmp}/host-ab.XXXXXX")
trap 'rm -rf "$T"' EXIT
S=$T/new; O=$T/old; mkdir -p "$S" "$O"
T0=$(date +%s)
el() { echo "[host-ab $(( $(date +%s) - T0 ))s] $*" >&2; }
# new: the checkout's attnkit (kernels/ at the root, if this checkout still has it there, as attnkit.kernels)
cp -r "$REPO/attnkit" "$S/attnkit"
if [ -d "$REPO/kernels" ]; then rm -rf "$S/attnkit/kernels"; cp -r "$REPO/kernels" "$S/attnkit/kernels"; fi
find "$S" -name __pycache__ -prune -exec rm -rf {} +
# old: the same attnkit, its kernels replaced by OLD_COMMIT's (at kernels/ or attnkit/kernels/ there)
cp -r "$S/attnkit" "$O/attnkit"; rm -rf "$O/attnkit/kernels"; mkdir -p "$T/src"
for d in kernels attnkit/kernels; do
    git -C "$REPO" archive "$OLD" "$d" 2>/dev/null | tar -x -C "$T/src" && break
done
if [ -d "$T/src/attnkit/kernels" ]; then mv "$T/src/attnkit/kernels" "$O/attnkit/kernels"
elif [ -d "$T/src/kernels" ]; then mv "$T/src/kernels" "$O/attnkit/kernels"
else echo "no kernels/ or attnkit/kernels/ at $OLD" >&2; exit 1; fi
el "staged: new = the checkout, old = $OLD's kernels"
cd "$T"  # never import the checkout's attnkit/ from the cwd
lim=${TH0:-130}
for who in new old new old; do
    d=$S; [ "$who" = old ] && d=$O
    PYTHONPATH=$d${PYTHONPATH:+:$PYTHONPATH} timeout -s INT -k 5 "$lim" python3 "$HERE/host_ab.py" "$who"
    el "$who: rc=$?"
    lim=${TH:-45}
done
