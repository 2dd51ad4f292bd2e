#!/usr/bin/env bash
# The whole benchmark record on one CUDA machine, in under 10 minutes, in one directory.
#
#   bench/gpu_suite.sh OUTDIR            # tables 1-5 + kernel microbenchmarks
#   bench/gpu_suite.sh OUTDIR --smoke    # the same plumbing with the tiny UNet (any device, ~2 min)
#
# Needs no network. torch, triton and pytest-benchmark must be importable; diffusers (and,
# for plots and progress bars, matplotlib and tqdm) are installed from wheels in
# $ATTNKIT_WHEELS (default bench/wheels/) when they are not importable: see bench/README.md.
# attnkit itself is staged from this checkout (kernels/ as attnkit.kernels) without pip.
#
# Writes OUTDIR/{results.json, table.md, *.png} (all tables merged), OUTDIR/kernels.json
# (pytest-benchmark), OUTDIR/tableN/ (each table's own run), OUTDIR/tiles/ (gpu_tiles.py:
# the Triton kernel's tiles against float64, and its speed beside SDPA), OUTDIR/info.txt,
# OUTDIR/nvidia-smi.txt and OUTDIR/suite.log. Every step has its share of the time budget
# (ATTNKIT_SUITE_SECONDS, default 540) and a hard timeout; a step that fails or runs out
# of time is logged and the suite goes on, so what finished is always kept.
# ATTNKIT_SUITE_STEPS picks steps by name for a shorter run (comma-separated, e.g.
# table1,table5-flux,table3; default all): table1 table4 kernels tiles table2
# table5-flux table5-sd3 table5-wan table3 (with --smoke: table5-flux-cpu, and no tiles).
# A name that is not a step stops the suite before it runs anything.
set -uo pipefail

usage() { echo "usage: $0 OUTDIR [--smoke]" >&2; exit 2; }
[ $# -ge 1 ] || usage
OUT=$1
SMOKE=0
[ "${2:-}" = "--smoke" ] && SMOKE=1
REPO=$(cd "$(dirname "$0")/.." && pwd)
STEPS=${ATTNKIT_SUITE_STEPS:-all}
STEPS=${STEPS// /}
KNOWN_STEPS=",table1,table4,kernels,tiles,table2,table5-flux,table5-sd3,table5-wan,table5-flux-cpu,table3,"
if [ "$STEPS" != all ]; then
    for step in ${STEPS//,/ }; do
        if [[ "$KNOWN_STEPS" != *",$step,"* ]]; then
            echo "ATTNKIT_SUITE_STEPS: no step named '$step'; the steps: ${KNOWN_STEPS//,/ }" >&2
            exit 2
        fi
    done
fi
PY=${PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/suite.log"
: > "$LOG"
START=$(date +%s)
BUDGET=${ATTNKIT_SUITE_SECONDS:-540}
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore

say() { echo "[suite $(( $(date +%s) - START ))s] $*" | tee -a "$LOG" >&2; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }

# -- dependencies ---------------------------------------------------------------------------
DEPS=$(mktemp -d "${TMPDIR:-/tmp}/attnkit-suite.XXXXXX")
trap 'rm -rf "$DEPS"' EXIT
WHEELS=${ATTNKIT_WHEELS:-$REPO/bench/wheels}
missing=()
for mod in diffusers huggingface_hub safetensors matplotlib tqdm; do
    "$PY" -c "import $mod" >/dev/null 2>&1 || missing+=("$mod")
done
if [ ${#missing[@]} -gt 0 ]; then
    if compgen -G "$WHEELS/*.whl" >/dev/null; then
        say "not importable: ${missing[*]}; installing the wheels in $WHEELS into $DEPS (no index, no deps)"
        "$PY" -m pip install -q --no-index --no-deps --target "$DEPS" "$WHEELS"/*.whl >>"$LOG" 2>&1 \
            || say "pip install of the wheels failed (see $LOG)"
    else
        say "not importable: ${missing[*]}; no wheels in $WHEELS (see bench/README.md)"
    fi
fi
# attnkit from this checkout, laid out as installed: kernels/ becomes attnkit.kernels.
rm -rf "$DEPS/attnkit"
cp -r "$REPO/attnkit" "$DEPS/attnkit"
rm -rf "$DEPS/attnkit/kernels" && cp -r "$REPO/kernels" "$DEPS/attnkit/kernels"
find "$DEPS/attnkit" -name __pycache__ -prune -exec rm -rf {} +
export PYTHONPATH="$DEPS${PYTHONPATH:+:$PYTHONPATH}"
cd "$OUT"  # never import the checkout's attnkit/ (it has no kernels/) from the cwd

if ! "$PY" -c "import torch, diffusers, attnkit" >>"$LOG" 2>&1; then
    say "cannot import torch, diffusers and attnkit: stopping (see $LOG)"
    exit 1
fi
"$PY" - <<'EOF' 2>&1 | tee -a "$LOG" >&2
import torch, diffusers, attnkit
from attnkit.backends.base import package_version as v
print("torch", torch.__version__, "| cuda", torch.version.cuda, "| diffusers", diffusers.__version__,
      "| triton", v("triton"), "| xformers", v("xformers"), "| flash-attn", v("flash-attn"),
      "| device", torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
EOF
command -v nvidia-smi >/dev/null && nvidia-smi -q > "$OUT/nvidia-smi.txt" 2>&1
"$PY" -m attnkit info > "$OUT/info.txt" 2>&1 || say "attnkit info failed (see info.txt)"

# -- the steps ------------------------------------------------------------------------------
if [ $SMOKE = 1 ]; then
    COMMON=(--preset tiny --repeats 2 --no-progress)
    KERNEL_FILTER=(-k "sd15_cross and fwd")
    export ATTNKIT_BENCH_ROUNDS=3
else
    COMMON=(--no-progress)
    KERNEL_FILTER=()
    export ATTNKIT_BENCH_ROUNDS=${ATTNKIT_BENCH_ROUNDS:-10}
fi
# Most telling first: a step cut short by its budget loses the processors at the end.
ORDER=vanilla,sdpa,triton,xformers,flash_attn,auto,sliced


# run_step NAME SHARE_SECONDS CMD...: soft budget = share (or what is left), hard timeout +90 s
run_step() {
    local name=$1 share=$2; shift 2
    if [ "$STEPS" != all ] && [[ ",$STEPS," != *",$name,"* ]]; then
        say "$name: not in ATTNKIT_SUITE_STEPS ($STEPS)"
        return
    fi
    local rest; rest=$(left)
    if [ "$rest" -lt 30 ]; then
        say "$name: skipped (suite budget spent)"
        return
    fi
    [ "$share" -gt "$rest" ] && share=$rest
    say "$name: budget ${share}s: $*"
    timeout --signal=INT --kill-after=20 $(( share + 90 )) "$@" \
        > "$OUT/$name.md" 2>> "$LOG"
    local rc=$?
    say "$name: exit $rc"
}

run_step table1 80 "$PY" -m attnkit bench "${COMMON[@]}" --tables 1 --processors "$ORDER" \
    --budget 80 --out "$OUT/table1"
run_step table4 45 "$PY" -m attnkit bench "${COMMON[@]}" --tables 4 --processors "$ORDER" \
    --budget 45 --out "$OUT/table4"
run_step kernels 110 "$PY" -m pytest "$REPO/bench" --benchmark-only -q -rs -p no:cacheprovider \
    --benchmark-json="$OUT/kernels.json" --benchmark-storage="file://$DEPS/benchmarks" \
    --benchmark-columns=median,iqr,rounds --benchmark-sort=name \
    "${KERNEL_FILTER[@]}"
# Every shipped Triton tile against float64 on this GPU (defaults first), then its speed
# beside SDPA and its host time per call: bench/gpu_tiles.py.
if [ $SMOKE = 0 ]; then
    run_step tiles 120 "$PY" "$REPO/bench/gpu_tiles.py" "$OUT/tiles" --seconds 70 --timing-seconds 35
fi
run_step table2 110 "$PY" -m attnkit bench "${COMMON[@]}" --tables 2 --processors "$ORDER" \
    --budget 110 --out "$OUT/table2"
SWEEP=(--sweep-dtypes float16,float32 --sweep-max-batch 32 --sweep-steps 3 --sweep-repeats 2)
[ $SMOKE = 1 ] && SWEEP=(--sweep-max-batch 4)
# Table 5: the transformers' forward per attention backend (diffusers' native / flash /
# sage beside attnkit), one preset per run; the smoke run uses the CPU-sized models.
if [ $SMOKE = 1 ]; then T5=(flux-cpu); else T5=(flux sd3 wan); fi
for preset in "${T5[@]}"; do
    run_step "table5-$preset" 40 "$PY" -m attnkit bench --no-progress --preset "$preset" --tables 5 \
        --budget 40 --out "$OUT/table5-$preset"
done
share3=$(( $(left) - 25 ))
[ "$share3" -lt 30 ] && share3=30
run_step table3 "$share3" "$PY" -m attnkit bench "${COMMON[@]}" --tables 3 \
    --processors vanilla,sdpa,triton,xformers,flash_attn "${SWEEP[@]}" --budget "$share3" --out "$OUT/table3"

# -- one record -----------------------------------------------------------------------------
# Only what this run wrote: an OUTDIR used before keeps the earlier run's tables, which
# are left where they are but not merged into this run's record.
parts=()
for part in "$OUT"/table[1-4]/results.json "$OUT"/table5-*/results.json; do
    if [ -f "$part" ] && [ "$(stat -c %Y "$part")" -ge "$START" ]; then
        parts+=("$part")
    elif [ -f "$part" ]; then
        say "not merged (written before this run): $part"
    fi
done
if [ ${#parts[@]} -gt 0 ]; then
    "$PY" -m attnkit.bench.report --merge "$OUT" "${parts[@]}" > /dev/null 2>> "$LOG" \
        && say "merged ${#parts[@]} runs into $OUT/results.json, table.md and plots"
fi
slug=$("$PY" -c "import re, torch; n = torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'; print(re.sub(r'[^a-z0-9]+', '-', n.lower()).strip('-'))" 2>/dev/null || echo unknown)
say "done in $(( $(date +%s) - START ))s; commit it as bench/results/$slug/ (results.json, table.md, *.png, kernels.json)"
