#!/usr/bin/env bash
# Seventeenth session's device calls on the decode attention with qk_norm_rope in its launch (attention.cu,
# split_kv_qk_partials; run from the repository root):
#   bash benches/gpu/h200_qk_round.sh MODE
#   ab:     check_kernels.py --only qk (the one launch bitwise qk_norm_rope + split_kv_decode: output, caches, the
#           raw qkv buffer) and the split-KV / fused / elementwise sections, then the engine A/B in one process
#           (profile_decode.py): the default (one launch) against qk-apart (two launches) at qwen3-8b batch 1 and
#           8 with the batch-1 graph timeline, and at qwen3-0.6b batch 1 and 8, then the engine smoke test
#           (CHECKS, V8, V06: other sections and variants; NOCHECK=1: no checks. The session's calls: `ab`;
#           V8/V06 "default o-pre0 o-pre3 ef-pre1 ef-pre3"; the trigger points of 2ef48b2 (reverted); CHECKS=qk with
#           "default ticket qk-apart" for the cluster fold; "default o-pre3 ef-pre3")
#   final:  on the final tree: check_kernels.py (CHECKS), the engine smoke test, the GPU-scale qwen3-8b
#           conformance clauses beside conformance at CI scale
#   bench:  the engine decode bench (its transformers peer included)
#   handoff: the engine A/B of the decode graphs' token hand-off (default against handoff0) at qwen3-8b and
#           qwen3-0.6b batch 1 and 8, the engine smoke test, conformance (CI scale and the GPU-scale qwen3-8b
#           clauses), then the engine decode bench
source benches/gpu/_env.sh
mode=${1:-ab}
shift
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
if [ "$mode" = ab ]; then
  [ -z "$NOCHECK" ] && checks 200 check_kernels_qk.log ${CHECKS:-qk splitkv fused elementwise}
  timeout 240 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 1 8 --profile-batches \
    --timeline-batches 1 --rounds 3 --variants ${V8:-default qk-apart} > "$OUT/profile_qk_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -vE "^\s+[0-9]+x" "$OUT/profile_qk_8b.log"
  grep -E "^\s+[0-9]+x" "$OUT/profile_qk_8b.log" | cut -c1-110
  timeout 120 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 1 8 --rounds 3 \
    --variants ${V06:-default qk-apart} > "$OUT/profile_qk_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -vE "^\s+[0-9]+x" "$OUT/profile_qk_06b.log"
  smoke 60
fi
if [ "$mode" = final ]; then
  checks 200 check_kernels_final.log ${CHECKS:-qk fused graph}
  smoke 100
  conformance_both 200 conformance_gpu_qwen3-8b_final.log 250
fi
if [ "$mode" = bench ]; then
  run_benches 260 "engine_decode"
  pack_bench
fi
if [ "$mode" = handoff ]; then
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 1 8 --rounds 3 \
    --variants default handoff0 > "$OUT/profile_handoff_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -E "^\s+[18] +" "$OUT/profile_handoff_8b.log"
  timeout 90 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 1 8 --rounds 3 \
    --variants default handoff0 > "$OUT/profile_handoff_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+[18] +" "$OUT/profile_handoff_06b.log"
  smoke 80
  conformance_both 200 conformance_gpu_qwen3-8b_handoff.log 250
  run_benches 200 "engine_decode"
  pack_bench
fi
