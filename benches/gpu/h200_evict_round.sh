#!/usr/bin/env bash
# Sixteenth session's device calls on the staged skinny GEMM's L2 policy (skinny_gemm.cu, l2_evict_first; run from
# the repository root):
#   bash benches/gpu/h200_evict_round.sh MODE
#   ab:     check_kernels.py --only staged (copies without an L2 hint bitwise the default's, among the rest), then the
#           engine A/B in one process (profile_decode.py): the default (evict-first weight copies, 2 early
#           stages) against the L2_VARIANTS (V8: the variants) at qwen3-8b batch 1 and 8 with the batch-1 graph
#           timeline, and at qwen3-0.6b batch 1 and 8 (V06)
#   (the session's "norm" mode, the A/B of the add + RMSNorm prologue of skinny_staged_norm, is in commit 42c8de7,
#   where this script was still benches/gpu/h200_l2_round.sh, the name of a fourteenth-session script before;
#   with that kernel: measured and reverted, docs/performance.md)
#   (its "early" mode, the A/B of the norms' and RoPE's early loads against the late-loading kernels, with the
#   check_kernels section "early" asserting their bits equal, is in commit aaf32ca)
#   (its "half" mode, the A/B of the staged kernel's last wave of tiles in halves, run as
#   `bash benches/gpu/h200_evict_round.sh half; bash benches/gpu/h200_evict_round.sh final`, is in commit 2c428fc)
#   final:  on the final tree: check_kernels.py --only staged skinny epilogue elementwise graph (CHECKS), the engine
#           smoke test, the GPU-scale qwen3-8b conformance clauses beside conformance at CI scale, then the engine
#           decode bench (its transformers peer included)
source benches/gpu/_env.sh
mode=${1:-ab}
shift
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
if [ "$mode" = ab ]; then
  [ -z "$NOCHECK" ] && checks 150 check_kernels_l2.log staged
  timeout 330 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 1 8 --profile-batches \
    --timeline-batches 1 --rounds 3 --variants ${V8:-default ef0 ef-pre1 ef-pre3} > "$OUT/profile_l2_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -vE "^\s+[0-9]+x" "$OUT/profile_l2_8b.log"
  grep -E "^\s+[0-9]+x" "$OUT/profile_l2_8b.log" | cut -c1-110
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 1 8 --rounds 3 \
    --variants ${V06:-default ef0} > "$OUT/profile_l2_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -vE "^\s+[0-9]+x" "$OUT/profile_l2_06b.log"
fi
if [ "$mode" = final ]; then
  checks 200 check_kernels_final.log ${CHECKS:-staged skinny epilogue elementwise graph}
  smoke 100
  conformance_gpu 200 qwen3-8b conformance_gpu_qwen3-8b_final.log > "$OUT/c8.summary" &
  conformance_ci 250
  wait
  cat "$OUT/c8.summary"; rm -f "$OUT/c8.summary"
  run_benches 220 "engine_decode"
  pack_bench
fi
