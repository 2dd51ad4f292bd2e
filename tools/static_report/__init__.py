"""Compile every shipped configuration of the flash-attention kernels for real GPUs and
read their machine code: a static performance report, and a gate. Not installed with
attnkit: run it from a checkout (make inspect).

    python -m tools.static_report --resume   # everything, sm_80 and sm_90 (make inspect); writes the report
    python -m tools.static_report --quick    # the default config of each kernel at head dims 40 / 128
    python -m tools.static_report --kernel fwd --head-dim 80 --dtype bf16 --arch 90 --bias none
    python -m tools.static_report --reference 06-fused-attention.py   # beside Triton's tutorial kernel
    python -m tools.static_report --render bench/results/static       # report.md again, no compiling
    python -m tools.static_report tiles --check   # the tile table is what tiles.py writes (tiles.py)

No GPU is needed: Triton compiles for a named target and ships ptxas and cuobjdump.
For each (kernel, head dim, dtype, bias variant, causal or not, TMA or pointer loads,
tile config, target) it reads from the cubin: registers per thread, stack bytes (a
non-zero stack is register spilling), shared memory; and from the SASS of the main loop
(sass.py says how it is found): its length, the matrix instructions it issues,
its exponentials. Every figure is static: instructions in the program text.

Definitions (written into the report too):

* scores per iteration: BLOCK_M x BLOCK_N, the query-key pairs one iteration of the
  main loop computes;
* instr/score = (main-loop length x warps) / scores: warp instructions issued per score;
* exp/score = (MUFU.EX2 in the loop x 32 x warps) / scores; one per score plus the
  row rescales of the forward (1 / BLOCK_N) is the least; twice that is duplication;
* MMA duplication = matrix FLOPs the loop issues / the FLOPs its matmuls need
  (2 x scores x padded head dim per matmul: 2 matmuls forward, 3 for dQ, 4 for dK/dV);
* tensor-bound limit: the tensor cores are the limit while the warp schedulers can
  issue the loop's instructions in the time its matrix work takes. An H100 SM issues 4
  warp instructions and 4096 dense fp16/bf16 FLOPs per clock (989 TFLOP/s at 1.83 GHz
  boost over 132 SMs), an A100 SM 4 and 2048 (312 TFLOP/s, 1.41 GHz, 108 SMs), so the
  limit is instr/score <= matmuls x 2 x padded head dim x 4 / FLOPs per clock: D/256
  for the forward on H100 (D = padded head dim), D/128 on A100.

It exits with status 1 if a configuration spills, needs more shared memory than its
target has, issues no tensor-core instruction in 16 bits, duplicates matrix work or
exponentials, compiles to more instr/score than the budget written next to it in
the tile table (attnkit/kernels/flash/tiles.py), or fails to compile. One exception, reported but not gated:
exact fp32 (dots on the FMA units) shows about 2 exp/score: in Triton's FMA layout 16
threads share each row, and each computes the row's rescale exp2 itself, which at 16-32
keys per tile costs about as many exponentials again as the scores' own (the TTGIR has
one exp2 per score). That loop is issue-bound at about 6 instr/score, of which the extra
exponential is one; 16-bit inputs and tf32 run on tensor cores, where the gate holds,
and on GPUs auto() sends fp32 to SDPA first.

Compiled variants. The kernels specialise on the bias (none, key padding, a full
(B, H, M, N) fp32 bias; and "full16", the inference forward's full bias in the inputs'
16-bit dtype, read as it is at BIAS_ALIGN = bias_form.BIAS_16BIT_ALIGN), on causality, and on Hopper on TMA or pointer loads (TMA where
the tensors are 16-byte aligned; both can run). The budget gates the variant a target
runs for aligned inputs: TMA loads on sm_90 (16-bit), pointer loads elsewhere; the
pointer variant on sm_90 is gated for spills, shared memory and duplication, and its
instr/score is reported. The kernels dkdv_dbias and dq_dbias are dkdv and dq when they
also write the gradient of the bias (the first sums dS over the queries in registers,
the second stores dS tiles), with their own candidates; they run only with a bias.
fwd_lo is the forward that also stores its rounding residual for the backward (16-bit
only). --quick compiles the default (first) configuration of each list only.

The INT8 forward (kernel "int8": attnkit/kernels/int8/kernels.py, _attn_fwd_int8) is
compiled with its tile per target, head dim and bias (int8/ops.py's TILES), pointer loads, in
fp16 and bf16, with no bias, key padding or a float32 full bias, causal or not, at every
head dim: q8 and k8 int8 with the head dim padded as int8/quant.qk_pieces pads it, their
scales float32, V and the output 16-bit. Its Q.K product runs on integer tensor cores
(IMMA on sm_80 and for sm_90's tiles under 64 rows, IGMMA on sm_90: the matrix kinds "imma"
and "igmma"), P.V on the 16-bit
ones. MMA duplication counts both matmuls at their own padded widths, and the tensor-bound
limit takes the int8 matmul at twice the 16-bit rate (compile.INT8_RATE: 624 against 312
TOPS on A100, 1979 against 989 on H100). The target int8-vs-exact (targets.py) reports its
default's instr/score beside the exact forward's default; it has no budget.

The block-sparse kernels (kernels "sparse_fwd", "sparse_dq", "sparse_dkdv":
attnkit/kernels/flash/sparse_kernels.py, launched by flash/sparse.py) are compiled by
sparse.py with their one tile per head dim (sparse.tile_for: 64 x 64 on 4 warps to head dim
128, 64 x 32 on 8 warps above; 2 stages), pointer loads, no bias, not causal (the block
table is the mask), in fp16 and bf16 at head dims 64, 128 and 256 (sparse.SPARSE_HEAD_DIMS),
on both targets. Each walks its table in two loops, the full tiles then the partial ones
(the element mask read from the table's store): the row's figures are the full-tile loop's
(the first, as for the other kernels), and its partial_* figures the partial-tile loop's.
The gate applies to both loops (spills, shared memory, duplicated matrix work or
exponentials); no budget. The target sparse-vs-dense (targets.py) puts both loops'
instr/score beside the dense kernel's default (fwd, dq, dkdv; no bias, not causal).
sparse.py is hashed into the source key and into the sparse rows' code keys only: adding
or changing the sparse rows leaves every other row's code key as it was.

The consumer targets (consumer.py: sm_75 for the T4, sm_86 and sm_89 for the RTX 30xx /
40xx, A10, L4, L40) get a few rows in a full run, not the whole matrix: the sm80 lists'
default tile of fwd, dq and dkdv at head dims 40-256, no bias and key padding, not
causal, pointer loads, fp16 and (not on sm_75) bf16, against the target's shared memory
(64 KiB on sm_75, 99 KiB on sm_86 / sm_89); no budget. Their section of report.md puts
each beside sm_80's same row; the targets and the other sections leave them out. Rows of
a (target, kernel) that consumer.NOT_CLEAN explains (sm_75: Triton emits no tensor-core
MMA there) are reported, not gated; the others gate as sm_80's do. Their tensor rate
(compile.CONSUMER_TENSOR_FLOPS) is in their code keys only: the other rows' keys stay.
--arch 75 / 86 / 89 compiles them alone.

Resuming. A row is keyed by source_key() (key.py: a hash of the code of the kernels,
limits.py, sass.py, the kernels' calling convention flash/abi.py, bias_form.BIAS_16BIT_ALIGN,
and this tool's functions that build, compile and read a row; comments and docstrings left
out), by its code key (build.code_key: a hash of the Triton IR its job builds to, its
target, options and analysis) and by its own tile and variant (compile_spec). --resume
keeps every row of the report in the output folder, and of the checkpoint
rows.partial.jsonl that each run appends to as it compiles, whose source key is this
checkout's; where the source key changed, it runs Triton's front end on each row's job (a
few hundredths of a second a row: the 3,854 rows of the full report in about 3 minutes
on two cores) and keeps the rows that build to the same code key; it compiles only the
rest. A comment or a host-code edit recompiles nothing; a refactor of the kernels' source
that compiles to the same code recompiles nothing either; a tile added to the table
compiles that tile; a killed run (even SIGKILL) loses at most the row it was writing.

Storage (store.py). The full run writes bench/results/static/: report.md (the tables),
report.json (the triton version, the commit, the source key, the date, the command, the
definitions, the targets' verdicts, the warp-specialization check and the tutorial's
rows) and the rows, one JSON object a line, in rows/sm80-fwd.jsonl, rows/sm90-dkdv.jsonl,
... (by target and kernel family: fwd with fwd_lo, dkdv with dkdv_dbias, dq with
dq_dbias). Not one file: the rows are 2.2 MB, and no tracked file may exceed 1 MB (the
largest row file is about 0.5 MB; one that would exceed 1 MB is split by dtype). Not
gzip: a new report's diff stays readable, a changed row is a changed line in the file of
its kernel, and git stores the unchanged lines once. Reading accepts the earlier
single-file layout too (every row inline in report.json); --render DIR rewrites it in
this one.

Modules: cli.py (this command line), jobs.py (which rows, in what order), compile.py
(one row: compile, read the cubin, gate), key.py (source key), store.py (the report's
files, resuming), targets.py (targets and report.md), sass.py (the SASS analysis),
reference.py (the tutorial kernel), warpspec.py (the warp-specialization check),
tiles.py (the tile table attnkit/kernels/flash/tiles.py, and its subcommand), consumer.py
(the consumer targets' rows and section).
"""
