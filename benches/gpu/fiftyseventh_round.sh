#!/usr/bin/env bash
# The fifty-seventh session's device calls (run from the repository root, any H100 or H200): the warpgroup GEMM's
# split-K fold spread over the cluster (ops.skinny_wg's spread=, runner.wg_spread_fold) and the per-CTA trace of
# the decode step's warpgroup GEMMs (benches/gpu/trace_wg.py; docs/performance/decode_step.md).
#   bash benches/gpu/fiftyseventh_round.sh check   # the kernel checks (wg, wg-norm: the spread fold bitwise the
#                       # gathered one), then the trace of a qwen3-0.6b decode step at batch 32 and 64, both folds
#   bash benches/gpu/fiftyseventh_round.sh ab      # the one-process A/B, gather against spread: qwen3-0.6b batch
#                       # 32 and 64 (graph timeline at 32), qwen3-8b batch 32 and 64
#   bash benches/gpu/fiftyseventh_round.sh all     # check's kernel checks, the qwen3-0.6b A/B, the trace at
#                       # batch 32, the qwen3-8b A/B, the trace at batch 64: one call
#   bash benches/gpu/fiftyseventh_round.sh min     # the checks, the qwen3-0.6b batch-32 A/B and its trace (what a
#                       # few minutes of device time hold)
source benches/gpu/_env.sh
mode=${1:-check}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
date +%T; build_kernels; date +%T
trace() {
  timeout 120 python3 benches/gpu/trace_wg.py --batch "$1" > "$OUT/trace_wg_0.6b_b$1.log" 2>&1
  echo "trace_wg b$1 rc=$?"; grep -v Warning "$OUT/trace_wg_0.6b_b$1.log"; date +%T
}
p06() {
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 32 64 --timeline-batches 32 --profile-batches \
    --variants gather spread --rounds 3 > "$OUT/profile_decode_spread_0.6b.log" 2>&1
  echo "profile_decode 0.6b rc=$?"; grep -E "^ +(32|64) |==" "$OUT/profile_decode_spread_0.6b.log"
  grep -E "graph timeline|skinny_wg|split_kv" "$OUT/profile_decode_spread_0.6b.log" | head -30; date +%T
}
p8() {
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 32 64 --profile-batches \
    --variants gather spread --rounds 3 > "$OUT/profile_decode_spread_8b.log" 2>&1
  echo "profile_decode 8b rc=$?"; grep -E "^ +(32|64) |==" "$OUT/profile_decode_spread_8b.log"; date +%T
}
case "$mode" in
  check) checks 150 check_kernels.log wg-norm wg; date +%T; trace 32; trace 64 ;;
  ab) p06; p8 ;;
  all) checks 150 check_kernels.log wg-norm wg; date +%T; p06; trace 32; p8; trace 64 ;;
  min) checks 100 check_kernels.log wg-norm wg; date +%T
       timeout 100 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 32 --profile-batches \
         --variants gather spread --rounds 3 > "$OUT/profile_decode_spread_0.6b.log" 2>&1
       echo "profile_decode 0.6b rc=$?"; grep -E "^ +32 |==" "$OUT/profile_decode_spread_0.6b.log"; trace 32 ;;
esac
date +%T
exit 0
