#!/usr/bin/env bash
# The whole benchmark record on one CUDA machine, in under 10 minutes.
#
#   bench/gpu_suite.sh [OUTDIR]           # tables 1-5 + kernel microbenchmarks + the kernel's tiles
#   bench/gpu_suite.sh [OUTDIR] --quick   # under 8 minutes, for a GPU lent briefly: SD1.5's table 1, the
#                                         # ladder's eager / CUDA-graph / torch.compile rows for sdpa and
#                                         # for attnkit's auto and triton, Flux's table 5 with its compiled
#                                         # rows, the kernel microbenchmarks, the 16-bit kernel check
#                                         # (full bias; D=40/64/128 against cuDNN), the Triton kernel's
#                                         # speed with its default tiles and autotuned, with what the
#                                         # autotuner chose (tile-timing: what per-GPU default tiles are
#                                         # made from, python -m tools.records), host time per call
#   bench/gpu_suite.sh [OUTDIR] --smoke   # the same plumbing with the tiny UNet (any device, ~2 min)
#   bench/gpu_suite.sh [--quick|--smoke] --dry-run   # print the plan: each step, its cap, their sum
#
# OUTDIR defaults to bench/out/gpu (git-ignored). It receives:
#   OUTDIR/results/<gpu>/  the record, laid out as it is committed under bench/results/<gpu>/
#                          (<gpu>: torch.cuda.get_device_name() in lower case with dashes):
#                          README.md (device, versions, commit, what ran), results.json, table.md
#                          and *.png (all tables merged, and the other steps' results as sections:
#                          the microbenchmarks, the 16-bit kernel check, host time per call),
#                          kernels/ (kernels.json: pytest-benchmark; kernels.md: its table;
#                          README.md), tiles/ (bench/gpu_tiles.py: the Triton kernel's tiles
#                          against float64 and its speed beside SDPA; with --quick its speed
#                          only, default tiles and autotuned). With --smoke the folder is
#                          <gpu>-smoke: a check of the plumbing, not a record.
#   OUTDIR/logs/           suite.log, info.txt (attnkit info), nvidia-smi.txt, each step's stdout
#                          (<step>.out), each table's own run (tableN/, table2-<who>/,
#                          table5-<preset>/) and the section files (sections/): never committed.
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
# hard timeout (share + 90 s); with --quick each step's cap is its hard limit (the steps'
# own budgets end before it), the caps sum to at most 480 s, and setting up takes the rest
# of the 8 minutes. A step that fails or runs out of time is logged and the suite goes on,
# so what finished is always kept.
# ATTNKIT_SUITE_STEPS picks steps by name for a shorter run (comma-separated, e.g.
# table1,table5-flux,table3; default all): the names are those --dry-run prints (with
# --smoke: table5-flux-cpu, and no tiles).
# A name that is not a step, or an option other than --smoke, --quick and --dry-run, stops
# the suite before it runs anything.
# ATTNKIT_COMMIT names the commit in the record's README where the checkout's .git is not
# current (default: git rev-parse, marked when attnkit/ or bench/ differ from it).
set -uo pipefail

usage() { echo "usage: $0 [OUTDIR] [--smoke | --quick] [--dry-run]   (OUTDIR default: bench/out/gpu)" >&2; exit 2; }
OUT=
SMOKE=0
QUICK=0
DRY=0
for arg in "$@"; do
    case $arg in
        --smoke) SMOKE=1 ;;
        --quick) QUICK=1 ;;
        --dry-run) DRY=1 ;;
        -h|--help) usage ;;
        -*) echo "$0: unknown option $arg" >&2; usage ;;
        *) [ -z "$OUT" ] || usage; OUT=$arg ;;
    esac
done
[ $SMOKE = 1 ] && [ $QUICK = 1 ] && { echo "$0: --smoke and --quick are two different runs: pick one" >&2; usage; }
REPO=$(cd "$(dirname "$0")/.." && pwd)

# -- the plan: each step and its cap (seconds) -----------------------------------------------
# --quick: most telling first (the ladder's compiled rows are what the issue is about); the
# caps are hard limits and sum to at most QUICK_LIMIT.
QUICK_LIMIT=480
QUICK_PLAN="table1:35 sparse:55 table2-sdpa:65 table2-attnkit:65 table5-flux:80 kernels16:45 tile-timing:35 overhead:30 launch:35 kernels:35"
FULL_PLAN="table1:80 sparse:60 table4:45 kernels16:35 overhead:30 launch:35 kernels:110 tiles:120 table2:110 table5-flux:40 table5-sd3:40 table5-wan:40 table3:rest"
SMOKE_PLAN="table1:80 sparse:60 table4:45 kernels16:35 overhead:30 launch:35 kernels:110 table2:110 table5-flux-cpu:40 table3:rest"
if [ $QUICK = 1 ]; then PLAN=$QUICK_PLAN; elif [ $SMOKE = 1 ]; then PLAN=$SMOKE_PLAN; else PLAN=$FULL_PLAN; fi
KNOWN_STEPS=",table1,sparse,table4,kernels,tiles,tile-timing,table2,table2-sdpa,table2-attnkit,table5-flux,table5-sd3,table5-wan,table5-flux-cpu,kernels16,overhead,launch,table3,"
STEPS=${ATTNKIT_SUITE_STEPS:-all}
STEPS=${STEPS// /}
if [ "$STEPS" != all ]; then
    for step in ${STEPS//,/ }; do
        if [[ "$KNOWN_STEPS" != *",$step,"* ]]; then
            echo "ATTNKIT_SUITE_STEPS: no step named '$step'; the steps: ${KNOWN_STEPS//,/ }" >&2
            exit 2
        fi
    done
fi
if [ $QUICK = 1 ]; then
    : "${ATTNKIT_SUITE_SECONDS:=$QUICK_LIMIT}"
fi
BUDGET=${ATTNKIT_SUITE_SECONDS:-540}
# cap_of NAME: the step's cap in this plan ("rest": what is left of the budget)
cap_of() { local e; for e in $PLAN; do [ "${e%%:*}" = "$1" ] && { echo "${e#*:}"; return; }; done; echo 0; }
selected() { [ "$STEPS" = all ] || [[ ",$STEPS," == *",$1,"* ]]; }

if [ $DRY = 1 ]; then
    mode=$([ $QUICK = 1 ] && echo --quick || ([ $SMOKE = 1 ] && echo --smoke || echo "(full)"))
    echo "bench/gpu_suite.sh $mode: plan (seconds; ATTNKIT_SUITE_STEPS=$STEPS, budget $BUDGET s)"
    total=0
    for e in $PLAN; do
        name=${e%%:*} cap=${e#*:}
        selected "$name" || continue
        if [ "$cap" = rest ]; then
            echo "  $(printf '%-16s' "$name") rest   (what is left of the budget)"
            continue
        fi
        if [ $QUICK = 1 ]; then
            echo "  $(printf '%-16s %4d' "$name" "$cap")   hard cap"
        else
            echo "  $(printf '%-16s %4d' "$name" "$cap")   share (hard limit $(( cap + 90 )))"
        fi
        total=$(( total + cap ))
    done
    if [ $QUICK = 1 ]; then
        echo "  $(printf '%-16s %4d' sum "$total")   (caps; at most $QUICK_LIMIT s, set-up and merging take the rest of 8 minutes)"
        [ "$total" -le "$QUICK_LIMIT" ] || { echo "$0: the quick plan's caps sum to $total s, over $QUICK_LIMIT" >&2; exit 1; }
    else
        echo "  $(printf '%-16s %4d' sum "$total")   (shares, before the rest; budget $BUDGET s)"
    fi
    exit 0
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
timeout 30 "$PY" -m attnkit info > "$LOGS/info.txt" 2>&1 || say "attnkit info failed (see $LOGS/info.txt)"
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
    # --quick: forward only, SD1.5's self- and cross-attention (4096 x 77: the short-key call),
    # cuDNN's and FlashAttention's SDPA and attnkit's kernel (kernels16 has D=64/128 and the bias)
    [ $QUICK = 1 ] && KERNEL_FILTER=(-k "not bwd and (sd15_self_4096_d40 or sd15_cross) and (cudnn or sdpa_flash or triton)")
    export ATTNKIT_BENCH_ROUNDS=${ATTNKIT_BENCH_ROUNDS:-10}
fi
# Most telling first: a step cut short by its budget loses the processors at the end.
ORDER=vanilla,sdpa,triton,xformers,flash_attn,auto,sliced


# run_step NAME CMD...: the step's cap from the plan (or what is left). --quick: the cap is the
# hard limit (SIGINT 10 s before it, then KILL); otherwise the cap is a share and the hard
# timeout share + 90 s. stdout to $STDOUT (default LOGS/NAME.out), stderr to the suite's log.
# In the command, @INNER@ is the budget to hand the tool: the cap, less (with --quick) the
# 20 s that starting Python and writing the results take.
RAN=()
run_step() {
    local name=$1; shift
    if ! selected "$name"; then
        say "$name: not in ATTNKIT_SUITE_STEPS ($STEPS)"
        return
    fi
    local rest cap hard; rest=$(left)
    cap=$(cap_of "$name")
    [ "$cap" = rest ] && cap=$(( rest - 25 ))
    if [ "$rest" -lt 20 ] || [ "$cap" -lt 15 ]; then
        say "$name: skipped (suite budget spent)"
        RAN+=("$name (skipped: budget spent)")
        return
    fi
    if [ $QUICK = 1 ]; then
        [ "$cap" -gt $(( rest - 5 )) ] && cap=$(( rest - 5 ))
        hard=$(( cap - 10 ))
    else
        [ "$cap" -gt "$rest" ] && cap=$rest
        hard=$(( cap + 90 ))
    fi
    CAP=$cap INNER=$cap
    [ $QUICK = 1 ] && INNER=$(( cap - 20 ))
    local cmd=() arg
    for arg in "$@"; do cmd+=("${arg//@INNER@/$INNER}"); done
    say "$name: cap ${cap}s (hard limit $(( hard + 10 ))s): ${cmd[*]}"
    timeout --signal=INT --kill-after=10 "$hard" "${cmd[@]}" \
        > "${STDOUT:-$LOGS/$name.out}" 2>> "$LOG"
    local rc=$?
    say "$name: exit $rc"
    RAN+=("$name (exit $rc)")
}
SECTIONS="$LOGS/sections"
mkdir -p "$SECTIONS"
# A table's own run: attnkit bench into LOGS/<dir>/ within the step's budget.
BENCH=("$PY" -m attnkit bench "${COMMON[@]}")

run_step table1 "${BENCH[@]}" --tables 1 --processors "$ORDER" --budget @INNER@ --out "$LOGS/table1"
# FlexAttention BlockMasks (bench/block_sparse.py): the block-sparse kernel at 10-90% density
# and a sliding window against FlexAttention compiled and eager, and a BlockMask model
# (AnyFlow FAR) stock against attnkit.apply: time, peak memory, error.
SPARSE_DEVICE=cuda; [ $SMOKE = 1 ] && SPARSE_DEVICE=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
SPARSE_ARGS=(--device "$SPARSE_DEVICE" --json "$LOGS/sparse/sparse.json")
[ $QUICK = 1 ] && SPARSE_ARGS+=(--tokens 8192 --rounds 5)
[ $SMOKE = 1 ] && SPARSE_ARGS+=(--tokens 1024 --rounds 2 --frames 4 --latent 16)
mkdir -p "$LOGS/sparse"
run_step sparse "$PY" "$REPO/bench/block_sparse.py" "${SPARSE_ARGS[@]}"
if [ -f "$LOGS/sparse.out" ] && [ "$(stat -c %Y "$LOGS/sparse.out")" -ge "$START" ]; then
    "$PY" -m attnkit.bench.sections text "$LOGS/sparse.out" --key sparse \
        --title "FlexAttention BlockMasks (bench/block_sparse.py)" --json "$LOGS/sparse/sparse.json" \
        --command "python bench/block_sparse.py ${SPARSE_ARGS[*]}" \
        --out "$SECTIONS/sparse.json" 2>> "$LOG" || say "sparse: no section written"
fi
if [ $QUICK = 1 ]; then
    # The ladder on SD1.5 512x512 fp16: each processor eager, under CUDA graphs
    # (torch.compile mode="reduce-overhead") and under torch.compile, how much of a step is
    # attention, the compiled output against eager; sdpa first, then attnkit's own.
    LADDER=(--tables 2 --ladder-rows eager,cudagraphs,compile --compile on --ladder-steps 20)
    run_step table2-sdpa "${BENCH[@]}" "${LADDER[@]}" --processors sdpa --budget @INNER@ --out "$LOGS/table2-sdpa"
    run_step table2-attnkit "${BENCH[@]}" "${LADDER[@]}" --processors auto,triton --budget @INNER@ \
        --out "$LOGS/table2-attnkit"
    # Flux's table 5: native and attnkit eager, then both under torch.compile.
    run_step table5-flux "$PY" -m attnkit bench --no-progress --preset flux --tables 5 \
        --attention "native,attnkit,attnkit + torch.compile,native + torch.compile" --budget @INNER@ \
        --out "$LOGS/table5-flux"
else
    run_step table4 "${BENCH[@]}" --tables 4 --processors "$ORDER" --budget @INNER@ --out "$LOGS/table4"
fi
# The 16-bit kernel check: attnkit's kernel with a full (B, H, M, N) bias against SDPA, and
# plain calls at D=40/64/128 against cuDNN's SDPA (the shapes the microbenchmarks lack).
SMALL=(); [ $SMOKE = 1 ] && SMALL=(--small)
run_step kernels16 "$PY" "$REPO/bench/checks/kernels16/kernels16.py" --seconds @INNER@ "${SMALL[@]}" \
    --section "$SECTIONS/kernels16.json"
if [ $QUICK = 1 ]; then
    # The Triton kernel beside SDPA on the plain shapes (D=40, 64, 128 forward), with the
    # shipped default tiles and then autotuned (most of the time: it compiles every
    # candidate), and what the autotuner chose (bench/gpu_tiles.py, no tile sweep, no host
    # time: the steps below measure that; the full bias is kernels16's): the evidence
    # python -m tools.records turns into per-GPU default tiles, in the record's tiles/ as
    # the full plan's tiles step writes it.
    run_step tile-timing "$PY" "$REPO/bench/gpu_tiles.py" "$RECORD/tiles" --skip-tiles --no-host \
        --timing-seconds @INNER@ --autotune-share 0.65 --timing-case "sd15 d40" --timing-case d64 \
        --timing-case d128
fi
# Host time per call (bench/overhead.py): part a, and the parts it lists beyond a-d (the
# dispatch route's tiny call), asked by name only where --help lists them; the launcher's
# part "l" is the launch step below, with a cap of its own (its first calls compile).
OVERHEAD_PARTS=a
parts_help=$("$PY" "$REPO/bench/overhead.py" --help 2>/dev/null | tr '\n' ' ' \
    | sed -nE 's/.*any of ([a-z, ]+[a-z]).*/\1/p' | tr -d ', ')
for part in $(echo "$parts_help" | grep -o .); do
    case $part in a|b|c|d|l) ;; *) OVERHEAD_PARTS+=$part ;; esac
done
OVERHEAD_DEVICE=cuda; [ $SMOKE = 1 ] && OVERHEAD_DEVICE=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
mkdir -p "$LOGS/overhead"
OVERHEAD_DTYPE=float32; [ "$OVERHEAD_DEVICE" = cuda ] && OVERHEAD_DTYPE=float16  # as the models run there
run_step overhead "$PY" "$REPO/bench/overhead.py" --device "$OVERHEAD_DEVICE" --dtype "$OVERHEAD_DTYPE" \
    --parts "$OVERHEAD_PARTS" --json "$LOGS/overhead/overhead.json"
if [ -f "$LOGS/overhead.out" ] && [ "$(stat -c %Y "$LOGS/overhead.out")" -ge "$START" ]; then
    "$PY" -m attnkit.bench.sections text "$LOGS/overhead.out" --key overhead \
        --title "Host time per call (bench/overhead.py --parts $OVERHEAD_PARTS)" --json "$LOGS/overhead/overhead.json" \
        --command "python bench/overhead.py --device $OVERHEAD_DEVICE --dtype $OVERHEAD_DTYPE --parts $OVERHEAD_PARTS" \
        --out "$SECTIONS/overhead.json" 2>> "$LOG" || say "overhead: no section written"
fi
# The Triton launcher's own host time per call (bench/launch_cost.py, overhead.py's part
# l): forward, with a key-padding mask, forward and backward, against SDPA; default tiles
# (host time does not depend on the tile, and autotuning would spend the cap compiling).
if [ -f "$REPO/bench/launch_cost.py" ]; then
    mkdir -p "$LOGS/launch"
    run_step launch env ATTNKIT_TRITON_AUTOTUNE=0 "$PY" "$REPO/bench/launch_cost.py" --device "$OVERHEAD_DEVICE" \
        --rounds 7 --calls 200 --json "$LOGS/launch/launch.json"
    if [ -f "$LOGS/launch.out" ] && [ "$(stat -c %Y "$LOGS/launch.out")" -ge "$START" ]; then
        "$PY" -m attnkit.bench.sections text "$LOGS/launch.out" --key launch \
            --title "The Triton launcher's host time per call (bench/launch_cost.py)" --json "$LOGS/launch/launch.json" \
            --command "ATTNKIT_TRITON_AUTOTUNE=0 python bench/launch_cost.py --device $OVERHEAD_DEVICE --rounds 7 --calls 200" \
            --out "$SECTIONS/launch.json" 2>> "$LOG" || say "launch: no section written"
    fi
fi
mkdir -p "$RECORD/kernels"
KERNEL_ARGS=(--benchmark-json="$RECORD/kernels/kernels.json" --benchmark-storage="file://$DEPS/benchmarks"
             --benchmark-columns=median,iqr,rounds --benchmark-sort=name)
STDOUT="$RECORD/kernels/kernels.md" \
run_step kernels "$PY" -m pytest "$REPO/bench" --benchmark-only -q -rs -p no:cacheprovider "${KERNEL_ARGS[@]}" \
    "${KERNEL_FILTER[@]}"
if [ -s "$RECORD/kernels/kernels.json" ]; then
    "$PY" -m attnkit.bench.sections kernels "$RECORD/kernels/kernels.json" --out "$SECTIONS/kernels.json" \
        --command "pytest bench/ --benchmark-only ${KERNEL_FILTER[*]}" 2>> "$LOG" || say "kernels: no section written"
    {
        echo "# Attention-kernel microbenchmarks"
        echo
        echo "\`pytest bench/ --benchmark-only ${KERNEL_FILTER[*]}\` on this GPU (bench/test_attention_kernels.py):"
        echo "\`kernels.json\` is pytest-benchmark's record (TFLOP/s in \`extra_info\`), \`kernels.md\` its table; the"
        echo "record's table.md has the same numbers as a section."
    } > "$RECORD/kernels/README.md"
else
    rm -rf "$RECORD/kernels"
fi
if [ $QUICK = 0 ]; then
    # Every shipped Triton tile against float64 on this GPU (defaults first), then its speed
    # beside SDPA and its host time per call: bench/gpu_tiles.py.
    if [ $SMOKE = 0 ]; then
        run_step tiles "$PY" "$REPO/bench/gpu_tiles.py" "$RECORD/tiles" --seconds 70 --timing-seconds 35
    fi
    run_step table2 "${BENCH[@]}" --tables 2 --processors "$ORDER" --budget @INNER@ --out "$LOGS/table2"
    SWEEP=(--sweep-dtypes float16,float32 --sweep-max-batch 32 --sweep-steps 3 --sweep-repeats 2)
    [ $SMOKE = 1 ] && SWEEP=(--sweep-max-batch 4)
    # Table 5: the transformers' forward per attention backend (diffusers' native / flash /
    # sage beside attnkit), one preset per run; the smoke run uses the CPU-sized models.
    if [ $SMOKE = 1 ]; then T5=(flux-cpu); else T5=(flux sd3 wan); fi
    for preset in "${T5[@]}"; do
        run_step "table5-$preset" "$PY" -m attnkit bench --no-progress --preset "$preset" --tables 5 \
            --budget @INNER@ --out "$LOGS/table5-$preset"
    done
    run_step table3 "${BENCH[@]}" --tables 3 --processors vanilla,sdpa,triton,xformers,flash_attn "${SWEEP[@]}" \
        --budget @INNER@ --out "$LOGS/table3"
fi

# -- one record -----------------------------------------------------------------------------
# Only what this run wrote: an OUTDIR used before keeps the earlier run's tables in its
# logs, which are left where they are but not merged into this run's record.
parts=()
for part in "$LOGS"/table*/results.json "$SECTIONS"/*.json; do
    if [ -f "$part" ] && [ "$(stat -c %Y "$part")" -ge "$START" ]; then
        parts+=("$part")
    elif [ -f "$part" ]; then
        say "not merged (written before this run): $part"
    fi
done
if [ ${#parts[@]} -gt 0 ]; then
    "$PY" -m attnkit.bench.report --merge "$RECORD" "${parts[@]}" > /dev/null 2>> "$LOG" \
        && say "merged ${#parts[@]} runs and sections into $RECORD/results.json, table.md and plots"
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
    [ -f "$RECORD/results.json" ] && echo "| \`table.md\`, \`results.json\`, \`*.png\` | the tables this run measured and the other steps' results (sections), merged (\`python -m attnkit.bench.report results.json\` redraws table.md and the plots) |"
    [ -d "$RECORD/kernels" ] && echo "| \`kernels/\` | the attention microbenchmarks (\`pytest bench/ --benchmark-only\`): \`kernels.json\` (TFLOP/s in \`extra_info\`) and its table, \`kernels.md\` |"
    if [ -f "$RECORD/tiles/tiles.jsonl" ]; then
        echo "| \`tiles/\` | \`bench/gpu_tiles.py\`: every tile run against float64 (\`tiles.jsonl\`), the speed beside SDPA (\`timing.json\`), both in \`summary.md\` |"
    elif [ -d "$RECORD/tiles" ]; then
        echo "| \`tiles/\` | \`bench/gpu_tiles.py --skip-tiles\`: the Triton kernel's speed beside SDPA with the shipped default tiles and autotuned, and what the autotuner chose (\`timing.json\`, in \`summary.md\`): what \`python -m tools.records\` makes per-GPU default tiles from |"
    fi
    echo
    echo "The logs (suite.log, info.txt, nvidia-smi.txt, each step's output) are not part of the record."
} > "$RECORD/README.md"
say "done in $(( $(date +%s) - START ))s; the record: $RECORD/ (logs: $LOGS/)"
if [ $SMOKE = 0 ]; then
    say "to keep it: cp -r $RECORD $REPO/bench/results/, say in its README.md what the run showed, and commit it"
fi
