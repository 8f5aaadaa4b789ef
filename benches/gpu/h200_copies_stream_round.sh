#!/usr/bin/env bash
# Eighteenth session's device calls on the decode step's fixed costs (run from the repository root):
#   bash benches/gpu/h200_copies_stream_round.sh MODE
#   ab:     check_kernels.py --only elementwise graph (embed_rmsnorm bitwise embedding + rmsnorm; graph capture),
#           the engine smoke test, then the engine A/B in one process (profile_decode.py): the default (two device
#           slots per decode graph key, the upload and read-back on a copy stream; the embedding and first norm in
#           one launch) against copies-inline and embed-apart at qwen3-8b and qwen3-0.6b batch 1 and 8 (batch-1
#           graph timelines), then qk-all (qk_norm_rope in the attention launch above 16 rows) against the default
#           at batch 32, 64 and 256
#   final:  check_kernels.py (CHECKS), the engine smoke test, conformance at CI scale beside the GPU-scale
#           qwen3-8b clauses, then the engine decode bench (its transformers peer included)
source benches/gpu/_env.sh
mode=${1:-ab}
shift
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
if [ "$mode" = ab ]; then
  checks 120 check_kernels_embed.log ${CHECKS:-elementwise graph}
  smoke 80
  timeout 200 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 1 8 --profile-batches \
    --timeline-batches 1 --rounds 3 --variants ${V8:-default copies-inline embed-apart} > "$OUT/profile_copies_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -vE "^\s+[0-9]+x" "$OUT/profile_copies_8b.log" | grep -v Warn
  grep -E "^\s+[0-9]+x" "$OUT/profile_copies_8b.log" | cut -c1-110 | head -30
  timeout 100 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 1 8 --profile-batches \
    --timeline-batches 1 --rounds 3 --variants ${V06:-default copies-inline embed-apart} > "$OUT/profile_copies_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+[18] +|graph timeline" "$OUT/profile_copies_06b.log" | cut -c1-160
  timeout 180 python3 benches/gpu/profile_decode.py --models qwen3-0.6b qwen3-8b --batches 32 64 256 --profile-batches \
    --rounds 3 --variants default qk-all > "$OUT/profile_qkrows.log" 2>&1
  echo "profile qk rows rc=$?"; grep -E "^ +[0-9]+ +(default|qk-all)|==" "$OUT/profile_qkrows.log"
fi
if [ "$mode" = final ]; then
  checks 200 check_kernels_final.log ${CHECKS:-elementwise qk fused graph}
  smoke 80
  conformance_gpu 200 qwen3-8b conformance_gpu_qwen3-8b_final.log > "$OUT/c8.summary" &
  conformance_ci 250
  wait
  cat "$OUT/c8.summary"; rm -f "$OUT/c8.summary"
  run_benches 260 "engine_decode"
  pack_bench
fi
