# Sourced by the benches/gpu/h200_*.sh device scripts (run from the repository root): a pipeline fails
# with its first failing command, logs go to $OUT (the device machine's output folder; benches/results
# elsewhere), Python runs unbuffered on the working tree with one CuPy kernel cache for every step.
set -o pipefail
OUT="${OUT:-benches/results}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" CUPY_CACHE_DIR=/tmp/cupy_cache

# compile (or load from the cache) every kernel once, before any step times anything
build_kernels() {
  python3 -c "import optimized.kernels as k; k.load_all(); print('kernels built')" 2>&1 | tail -3
}

# profile_with TAG MODEL [RUN_WITH_ARGS...]: profile_decode.py at MODEL batch 32 and 64 (the default variant, 3 rounds)
# into $OUT/profile_decode_TAG.log, with the kernels built as run_with.py's arguments say (--define NAME,
# --skinny-wg-source FILE; none: as built), and its step lines
profile_with() {
  local tag=$1 model=$2; shift 2
  timeout 240 python3 benches/gpu/run_with.py "$@" benches/gpu/profile_decode.py --models "$model" \
    --batches 32 64 --profile-batches --variants spread --rounds 3 > "$OUT/profile_decode_$tag.log" 2>&1
  echo "profile_decode $tag rc=$?"; grep -E "^ +(32|64) " "$OUT/profile_decode_$tag.log"
}

# run_benches SECONDS EXPR [PYTEST ARGS...]: the pytest benches matching EXPR (benches/run_gpu.sh -k EXPR ARGS,
# reports under $OUT/bench) and their target lines
run_benches() {
  local secs=$1 expr=$2; shift 2
  timeout "$secs" bash benches/run_gpu.sh -k "$expr" "$@" > /dev/null 2>&1
  echo "benches ($expr) rc=$?"
  grep -E "\[(MET |miss)\]|passed|failed" "$OUT/bench/run_gpu.log" | tail -10
}

# pack_bench: $OUT/bench's reports into $OUT/bench.tgz (a device call returns only a few files)
pack_bench() {
  tar czf "$OUT/bench.tgz" -C "$OUT/bench" . && rm -rf "$OUT/bench"
}

# bench_packed SECONDS EXPR LOG: run_benches SECONDS EXPR, its log kept as $OUT/LOG, the reports packed (pack_bench)
bench_packed() {
  run_benches "$1" "$2"
  mv "$OUT/bench/run_gpu.log" "$OUT/$3" 2>/dev/null
  pack_bench
}

# ncu_prefill VARIANT PROBLEM SECONDS: Nsight Compute (speed of light, warp states, compute workload, schedulers,
# occupancy) on the first launch of paged_prefill_d128_VARIANT in probe_kernels.py --only prefill (PROBLEM: N,C,P)
# into $OUT/ncu_prefill_VARIANT_NxCxP.txt, and its main lines
ncu_prefill() {
  local f="$OUT/ncu_prefill_${1}_${2//,/x}.txt"
  timeout "$3" ncu --clock-control none -k "regex:paged_prefill_d128_${1}\$" --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section SchedulerStats \
    --section Occupancy python3 benches/gpu/probe_kernels.py --only prefill --reps 1 --prefill-problems "$2" \
    > "$f" 2>&1
  echo "ncu $1 $2 rc=$?"
  grep -E "Duration|Issue Slots Busy|Executed Ipc A|Warp Cycles Per Issued|No Eligible|Achieved Occupancy|Registers Per|Pipe|Stall|highest-utilized" \
    "$f" | cut -c1-130 | head -16
}

# smoke SECONDS: the engine smoke test (every section), its verdict lines
smoke() {
  timeout "$1" python3 benches/gpu/engine_smoke.py > "$OUT"/engine_smoke.log 2>&1; echo "engine_smoke rc=$?"
  grep -E "^\[(ok|FAIL)|FAILED|Error|lookahead steps" "$OUT"/engine_smoke.log | head -20
}

# checks_beside_smoke CHECK_SECS SMOKE_SECS TAG SECTIONS...: check_kernels.py's SECTIONS (into
# $OUT/check_kernels_gemm$TAG.log) beside the engine smoke test (its log kept as $OUT/engine_smoke$TAG.log), untimed,
# then both summaries. The caller may start a third untimed step in the background first: the wait here takes it too
checks_beside_smoke() {
  local csecs=$1 ssecs=$2 tag=$3; shift 3
  ( checks "$csecs" "check_kernels_gemm$tag.log" "$@" ) > "$OUT/checks.summary" &
  ( smoke "$ssecs" ) > "$OUT/smoke.summary" &
  wait; cat "$OUT/checks.summary" "$OUT/smoke.summary"; rm -f "$OUT/checks.summary" "$OUT/smoke.summary"
  mv "$OUT/engine_smoke.log" "$OUT/engine_smoke$tag.log"
}

# conformance_ci SECONDS: the conformance suite at CI scale on the optimized engine
conformance_ci() {
  timeout "$1" python3 -m pytest conformance -q -rs -p no:cacheprovider --engine optimized --durations=5 \
    > "$OUT"/conformance_ci_optimized.log 2>&1
  echo "conformance ci rc=$?"; grep -E "CONFORMANCE FAILURE|^FAILED" "$OUT"/conformance_ci_optimized.log | head -8
  tail -1 "$OUT"/conformance_ci_optimized.log
}

# conformance_gpu SECONDS FILTER LOG: the conformance clauses matching FILTER (pytest -k) at the GPU scale on
# the optimized engine, into $OUT/LOG, and its failures and summary
conformance_gpu() {
  timeout "$1" python3 -m pytest conformance -q -rs -p no:cacheprovider --engine optimized --durations=5 \
    --conformance-scale gpu --oracle-device cuda -k "$2" > "$OUT/$3" 2>&1
  echo "conformance gpu ($2) rc=$?"; grep -E "CONFORMANCE FAILURE|^FAILED" "$OUT/$3" | head -8; tail -1 "$OUT/$3"
}

# conformance_8b_if_it_fits SECONDS: the qwen3-8b clauses at GPU scale (into $OUT/conformance_gpu_qwen3-8b.log) where
# the card has the memory they need (about 96 GiB: an H200); nothing on a smaller card
conformance_8b_if_it_fits() {
  local mem; mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  [ "$mem" -gt 100000 ] && conformance_gpu "$1" qwen3-8b conformance_gpu_qwen3-8b.log
}

# conformance_both GPU_SECONDS GPU_LOG CI_SECONDS: the GPU-scale qwen3-8b clauses (into $OUT/GPU_LOG) beside the
# suite at CI scale, then both summaries
conformance_both() {
  conformance_gpu "$1" qwen3-8b "$2" > "$OUT/c8.summary" &
  conformance_ci "$3"
  wait
  cat "$OUT/c8.summary"; rm -f "$OUT/c8.summary"
}

# checks SECONDS LOG SECTIONS...: check_kernels.py on some sections (all of them without SECTIONS), its
# failures and its summary; all_checks SECONDS LOG: on every section
checks() {
  local secs=$1 log=$2 only=(); shift 2
  [ $# -gt 0 ] && only=(--only "$@")
  timeout "$secs" python3 benches/gpu/check_kernels.py "${only[@]}" > "$OUT/$log" 2>&1; echo "check_kernels $* rc=$?"
  grep -E "FAIL" "$OUT/$log" | head -20; tail -1 "$OUT/$log"
}
all_checks() { checks "$1" "$2"; }

# ab SECONDS BASE LOG [ARGS...]: ab_attention.py against $V/BASE (V: the caller's folder of attention.cu
# versions, benches/gpu/ab_variants by default; ARGS: --new, --only, ...) into $OUT/LOG, and its registers
# line, per-problem lines and verdict
ab() {
  local secs=$1 base=$2 log=$3; shift 3
  timeout "$secs" python3 benches/gpu/ab_attention.py --base "${V:-benches/gpu/ab_variants}/$base" "$@" \
    > "$OUT/$log" 2>&1
  echo "ab vs $base $* rc=$?"; grep -E "regs|new/base|bitwise|DIFFER" "$OUT/$log" | cut -c1-300 | tail -30
}

# probe_trailing SECONDS LOG: probe_decode_cudnn.py at the four shapes where the decode kernel trails cuDNN (32 x 4096,
# 32 x 16384, 128 x 1024, 128 x 4096) and three beside them (33 x 4096, 8 x 4096, 1 x 16384), over shuffled and
# in-order pages, three rounds, into $OUT/LOG, and its difference and rate lines
probe_trailing() {
  timeout "$1" python3 benches/gpu/probe_decode_cudnn.py --shapes 32x4096 32x16384 128x1024 128x4096 33x4096 \
    8x4096 1x16384 --layouts shuffled inorder --rounds 3 > "$OUT/$2" 2>&1
  echo "probe_decode_cudnn rc=$?"; grep -E "DIFFER|TB/s|cudnn|Error|error" "$OUT/$2" | cut -c1-120
}

# Nsight Compute metrics of the attention profiles: time, instructions, HMMA, the main stalls, issue activity
NCU_METRICS=gpu__time_duration.sum,smsp__inst_executed.sum,smsp__inst_executed_pipe_tensor_op_hmma.sum
for st in wait barrier long_scoreboard short_scoreboard math_pipe_throttle mio_throttle; do
  NCU_METRICS+=",smsp__average_warps_issue_stalled_${st}_per_issue_active.ratio"
done
NCU_METRICS+=",smsp__issue_active.avg.pct_of_peak_sustained_active"

# ncu_ab REGEX BASE SECTION PROBLEM LOG: $NCU_METRICS of the first two launches of the kernels matching REGEX
# in ab_attention.py (--only SECTION --problems PROBLEM: the base's launch first, then the tree's) into
# $OUT/LOG, and its metric lines
ncu_ab() {
  timeout 150 ncu --clock-control none -k "regex:$1" --launch-skip 0 --launch-count 2 --metrics "$NCU_METRICS" \
    python3 benches/gpu/ab_attention.py --base "${V:-benches/gpu/ab_variants}/$2" --only "$3" --rounds 1 --reps 1 \
    --problems "$4" > "$OUT/$5" 2>&1
  echo "ncu $1 ($3 problem $4) rc=$?"
  grep -E "paged_prefill|split_kv_partials|duration|inst_executed|stalled|issue_active|dram__" "$OUT/$5" | head -30
}

# conf SECONDS LOG ARGS...: the conformance suite on the optimized engine through count_prefill_graphs.py, with
# the prefill graphs on (h200_fortyfirst_round.sh, h200_fortyfifth_round.sh)
conf() {
  local secs=$1 log=$2; shift 2
  timeout "$secs" python3 benches/gpu/count_prefill_graphs.py --prefill-graph-tokens 256 \
    conformance -q -rs -p no:cacheprovider --engine optimized --durations=8 "$@" > "$OUT/$log" 2>&1
  echo "== $log rc=$?"; grep -E "CONFORMANCE FAILURE|^FAILED" "$OUT/$log" | head -8
  grep -E " passed| failed|^prefill graphs:" "$OUT/$log" | tail -2
}
