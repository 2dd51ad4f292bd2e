#!/usr/bin/env bash
# The whole benchmark record on one CUDA machine, in under 10 minutes.
#
#   bench/gpu_suite.sh [OUTDIR]           # tables 1-5 + kernel microbenchmarks + the kernel's tiles
#   bench/gpu_suite.sh [OUTDIR] --quick   # a short record: SD1.5's table 1, the kernel microbenchmarks,
#                                         # Flux's table 5 (about 4 minutes: for a GPU lent briefly)
#   bench/gpu_suite.sh [OUTDIR] --smoke   # the same plumbing with the tiny UNet (any device, ~2 min)
#
# OUTDIR defaults to bench/out/gpu (git-ignored). It receives:
#   OUTDIR/results/<gpu>/  the record, laid out as it is committed under bench/results/<gpu>/
#                          (<gpu>: torch.cuda.get_device_name() in lower case with dashes):
#                          README.md (device, versions, commit, what ran), results.json, table.md
#                          and *.png (all tables merged), kernels/ (kernels.json: pytest-benchmark;
#                          kernels.md: its table), tiles/ (bench/gpu_tiles.py: the Triton kernel's
#                          tiles against float64 and its speed beside SDPA). With --smoke the
#                          folder is <gpu>-smoke: a check of the plumbing, not a record.
#   OUTDIR/logs/           suite.log, info.txt (attnkit info), nvidia-smi.txt, each step's stdout
#                          (<step>.out) and each table's own run (tableN/, table5-<preset>/):
#                          never committed.
# Copy OUTDIR/results/<gpu>/ to bench/results/<gpu>/, say in its README.md what the run
# showed, and commit it. OUTDIR may not lie under bench/results/ (logs do not go there).
#
# Needs no network. torch, triton and pytest-benchmark must be importable; diffusers (and,
# for plots and progress bars, matplotlib and tqdm) are installed from wheels in
# $ATTNKIT_WHEELS when they are not importable: by default bench/out/wheels/ (git-ignored;
# `pip download -d bench/out/wheels ...` creates it, see bench/README.md), carried to the
# GPU machine with the tree.
# attnkit itself (with attnkit/kernels/) is staged from this checkout without pip.
#
# Every step has its share of the time budget (ATTNKIT_SUITE_SECONDS, default 540) and a
# hard timeout; a step that fails or runs out of time is logged and the suite goes on, so
# what finished is always kept.
# ATTNKIT_SUITE_STEPS picks steps by name for a shorter run (comma-separated, e.g.
# table1,table5-flux,table3; default all): table1 table4 kernels tiles table2
# table5-flux table5-sd3 table5-wan table3 (with --smoke: table5-flux-cpu, and no tiles;
# --quick: table1,kernels,table5-flux in 240 s unless these variables say otherwise).
# A name that is not a step, or an option other than --smoke and --quick, stops the suite
# before it runs anything.
# ATTNKIT_COMMIT names the commit in the record's README where the checkout's .git is not
# current (default: git rev-parse, marked when attnkit/ or bench/ differ from it).
set -uo pipefail

usage() { echo "usage: $0 [OUTDIR] [--smoke | --quick]   (OUTDIR default: bench/out/gpu)" >&2; exit 2; }
OUT=
SMOKE=0
QUICK=0
for arg in "$@"; do
    case $arg in
        --smoke) SMOKE=1 ;;
        --quick) QUICK=1 ;;
        -h|--help) usage ;;
        -*) echo "$0: unknown option $arg" >&2; usage ;;
        *) [ -z "$OUT" ] || usage; OUT=$arg ;;
    esac
done
[ $SMOKE = 1 ] && [ $QUICK = 1 ] && { echo "$0: --smoke and --quick are two different runs: pick one" >&2; usage; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
if [ $QUICK = 1 ]; then
    STEPS=${ATTNKIT_SUITE_STEPS:-table1,kernels,table5-flux}
    : "${ATTNKIT_SUITE_SECONDS:=240}"
else
    STEPS=${ATTNKIT_SUITE_STEPS:-all}
fi
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
OUT=$(realpath -m "${OUT:-$REPO/bench/out/gpu}")
case "$OUT/" in
    "$(realpath "$REPO")/bench/results/"*)
        echo "$0: OUTDIR $OUT is under bench/results/: give one outside it (the record goes to OUTDIR/results/<gpu>/)" >&2
        exit 2 ;;
esac
mkdir -p "$OUT" || exit 1
LOGS="$OUT/logs"
mkdir -p "$LOGS"
LOG="$LOGS/suite.log"
: > "$LOG"
START=$(date +%s)
BUDGET=${ATTNKIT_SUITE_SECONDS:-540}
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore

say() { echo "[suite $(( $(date +%s) - START ))s] $*" | tee -a "$LOG" >&2; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }

# -- dependencies ---------------------------------------------------------------------------
DEPS=$(mktemp -d "${TMPDIR:-/tmp}/attnkit-suite.XXXXXX")
trap 'rm -rf "$DEPS"' EXIT
WHEELS=${ATTNKIT_WHEELS:-$REPO/bench/out/wheels}
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
        say "not importable: ${missing[*]}; no wheels in $WHEELS (pip download them there: see bench/README.md)"
    fi
fi
# attnkit from this checkout, copied beside the wheels' packages (no pip, no build).
rm -rf "$DEPS/attnkit"
cp -r "$REPO/attnkit" "$DEPS/attnkit"
find "$DEPS/attnkit" -name __pycache__ -prune -exec rm -rf {} +
export PYTHONPATH="$DEPS${PYTHONPATH:+:$PYTHONPATH}"
cd "$LOGS"  # the staged copy is what imports, never the checkout's from the cwd

if ! "$PY" -c "import torch, diffusers, attnkit" >>"$LOG" 2>&1; then
    say "cannot import torch, diffusers and attnkit: stopping (see $LOG)"
    exit 1
fi
VERSIONS=$("$PY" - <<'EOF' 2>&1
import torch, diffusers, attnkit
from attnkit.backends.base import package_version as v
print("torch", torch.__version__, "| cuda", torch.version.cuda, "| diffusers", diffusers.__version__,
      "| triton", v("triton"), "| xformers", v("xformers"), "| flash-attn", v("flash-attn"),
      "| device", torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
EOF
)
echo "$VERSIONS" | tee -a "$LOG" >&2
command -v nvidia-smi >/dev/null && nvidia-smi -q > "$LOGS/nvidia-smi.txt" 2>&1
"$PY" -m attnkit info > "$LOGS/info.txt" 2>&1 || say "attnkit info failed (see $LOGS/info.txt)"
DEVICE=$("$PY" -c "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')" 2>/dev/null || echo unknown)
slug=$(echo "$DEVICE" | tr 'A-Z' 'a-z' | sed -E 's/[^a-z0-9]+/-/g; s/^-+//; s/-+$//')
[ -n "$slug" ] || slug=unknown
[ $SMOKE = 1 ] && slug=$slug-smoke
RECORD="$OUT/results/$slug"
if [ -e "$RECORD" ]; then  # an earlier run's record: kept beside, never mixed into this one
    aside="$RECORD.before-$(date -u +%Y%m%dT%H%M%S)"
    mv "$RECORD" "$aside" && say "an earlier record was in $RECORD: moved to $aside"
fi
mkdir -p "$RECORD"
# The commit the code is at (ATTNKIT_COMMIT says it where the checkout's .git is not current).
if [ -n "${ATTNKIT_COMMIT:-}" ]; then
    COMMIT=$ATTNKIT_COMMIT
else
    COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
    git -C "$REPO" diff --quiet HEAD -- attnkit bench 2>/dev/null || COMMIT="$COMMIT (with changes not committed)"
fi

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


# run_step NAME SHARE_SECONDS CMD...: soft budget = share (or what is left), hard timeout +90 s;
# stdout to $STDOUT (default LOGS/NAME.out), stderr to the suite's log
RAN=()
run_step() {
    local name=$1 share=$2; shift 2
    if [ "$STEPS" != all ] && [[ ",$STEPS," != *",$name,"* ]]; then
        say "$name: not in ATTNKIT_SUITE_STEPS ($STEPS)"
        return
    fi
    local rest; rest=$(left)
    if [ "$rest" -lt 30 ]; then
        say "$name: skipped (suite budget spent)"
        RAN+=("$name (skipped: budget spent)")
        return
    fi
    [ "$share" -gt "$rest" ] && share=$rest
    say "$name: budget ${share}s: $*"
    timeout --signal=INT --kill-after=20 $(( share + 90 )) "$@" \
        > "${STDOUT:-$LOGS/$name.out}" 2>> "$LOG"
    local rc=$?
    say "$name: exit $rc"
    RAN+=("$name (exit $rc)")
}

run_step table1 80 "$PY" -m attnkit bench "${COMMON[@]}" --tables 1 --processors "$ORDER" \
    --budget 80 --out "$LOGS/table1"
run_step table4 45 "$PY" -m attnkit bench "${COMMON[@]}" --tables 4 --processors "$ORDER" \
    --budget 45 --out "$LOGS/table4"
mkdir -p "$RECORD/kernels"
STDOUT="$RECORD/kernels/kernels.md" \
run_step kernels 110 "$PY" -m pytest "$REPO/bench" --benchmark-only -q -rs -p no:cacheprovider \
    --benchmark-json="$RECORD/kernels/kernels.json" --benchmark-storage="file://$DEPS/benchmarks" \
    --benchmark-columns=median,iqr,rounds --benchmark-sort=name \
    "${KERNEL_FILTER[@]}"
[ -s "$RECORD/kernels/kernels.json" ] || rm -rf "$RECORD/kernels"
# Every shipped Triton tile against float64 on this GPU (defaults first), then its speed
# beside SDPA and its host time per call: bench/gpu_tiles.py.
if [ $SMOKE = 0 ]; then
    run_step tiles 120 "$PY" "$REPO/bench/gpu_tiles.py" "$RECORD/tiles" --seconds 70 --timing-seconds 35
fi
run_step table2 110 "$PY" -m attnkit bench "${COMMON[@]}" --tables 2 --processors "$ORDER" \
    --budget 110 --out "$LOGS/table2"
SWEEP=(--sweep-dtypes float16,float32 --sweep-max-batch 32 --sweep-steps 3 --sweep-repeats 2)
[ $SMOKE = 1 ] && SWEEP=(--sweep-max-batch 4)
# Table 5: the transformers' forward per attention backend (diffusers' native / flash /
# sage beside attnkit), one preset per run; the smoke run uses the CPU-sized models.
if [ $SMOKE = 1 ]; then T5=(flux-cpu); else T5=(flux sd3 wan); fi
for preset in "${T5[@]}"; do
    run_step "table5-$preset" 40 "$PY" -m attnkit bench --no-progress --preset "$preset" --tables 5 \
        --budget 40 --out "$LOGS/table5-$preset"
done
share3=$(( $(left) - 25 ))
[ "$share3" -lt 30 ] && share3=30
run_step table3 "$share3" "$PY" -m attnkit bench "${COMMON[@]}" --tables 3 \
    --processors vanilla,sdpa,triton,xformers,flash_attn "${SWEEP[@]}" --budget "$share3" --out "$LOGS/table3"

# -- one record -----------------------------------------------------------------------------
# Only what this run wrote: an OUTDIR used before keeps the earlier run's tables in its
# logs, which are left where they are but not merged into this run's record.
parts=()
for part in "$LOGS"/table[1-4]/results.json "$LOGS"/table5-*/results.json; do
    if [ -f "$part" ] && [ "$(stat -c %Y "$part")" -ge "$START" ]; then
        parts+=("$part")
    elif [ -f "$part" ]; then
        say "not merged (written before this run): $part"
    fi
done
if [ ${#parts[@]} -gt 0 ]; then
    "$PY" -m attnkit.bench.report --merge "$RECORD" "${parts[@]}" > /dev/null 2>> "$LOG" \
        && say "merged ${#parts[@]} runs into $RECORD/results.json, table.md and plots"
fi
# The record's README: what ran; what the run showed is for whoever commits it to add.
{
    echo "# $DEVICE: bench/gpu_suite.sh$([ $SMOKE = 1 ] && echo ' --smoke')$([ $QUICK = 1 ] && echo ' --quick') ($(date -u +%Y-%m-%d))"
    echo
    [ $SMOKE = 1 ] && printf '%s\n\n' "A smoke run (the tiny UNet): it checks the plumbing; its numbers are not a record."
    echo "- code: commit $COMMIT"
    echo "- versions: $VERSIONS"
    ran=$(printf '%s, ' "${RAN[@]}"); ran=${ran%, }
    echo "- steps (ATTNKIT_SUITE_STEPS=$STEPS, budget ${BUDGET} s, $(( $(date +%s) - START )) s in all): ${ran:-none}"
    echo
    echo "| path | what |"
    echo "|---|---|"
    [ -f "$RECORD/results.json" ] && echo "| \`table.md\`, \`results.json\`, \`*.png\` | the tables this run measured, merged (\`python -m attnkit.bench.report results.json\` redraws table.md and the plots) |"
    [ -d "$RECORD/kernels" ] && echo "| \`kernels/\` | the attention microbenchmarks (\`pytest bench/ --benchmark-only\`): \`kernels.json\` (TFLOP/s in \`extra_info\`) and its table, \`kernels.md\` |"
    [ -d "$RECORD/tiles" ] && echo "| \`tiles/\` | \`bench/gpu_tiles.py\`: every tile run against float64 (\`tiles.jsonl\`), the speed beside SDPA (\`timing.json\`), both in \`summary.md\` |"
    echo
    echo "The logs (suite.log, info.txt, nvidia-smi.txt, each step's output) are not part of the record."
} > "$RECORD/README.md"
say "done in $(( $(date +%s) - START ))s; the record: $RECORD/ (logs: $LOGS/)"
if [ $SMOKE = 0 ]; then
    say "to keep it: cp -r $RECORD $REPO/bench/results/, say in its README.md what the run showed, and commit it"
fi
