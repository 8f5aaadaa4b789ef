#!/usr/bin/env bash
# Nineteenth session's device calls: the staged skinny GEMM for decode steps of 9-32 rows (run from the repository
# root):
#   bash benches/gpu/h200_wide_round.sh MODE
#   probe:  check_kernels.py --only staged staged_wide (the 8-row kernels unchanged, the wide kernels' bits), then
#           probe_blas.py at 8, 16 and 32 rows (cuBLAS, the register kernel, every staged configuration built for
#           the rows; each GEMM alone, weights from DRAM), then the engine A/B in one process at qwen3-8b batch 32
#           (profile_decode.py: the default, cuBLAS above 8 rows, against the WIDE_VARIANTS; graph timelines of
#           the default and w32-512x3)
#   rows16: (PROBE=1: probe_blas.py as in probe first) the same A/B at qwen3-8b batch 16 (graph timelines) and
#           qwen3-0.6b batch 16 and 32
#   rule:   (the engine's default since: 9-16 rows on the wide kernel for weights of at most 32M elements) the
#           default against wide0 (cuBLAS above 8 rows) and w16-512x3 (every weight on it) at qwen3-8b batch 16
#           (graph timelines) and 12, qwen3-0.6b batch 16 and 12; check_kernels.py (CHECKS), the engine smoke
#           test, conformance at CI scale beside the GPU-scale qwen3-8b clauses
#   rows32: the 32-row kernels with the engine's size limit (w32-lim, w32-t2lim) and on qkv and o_proj alone
#           (w32-qo) against the default at qwen3-0.6b batch 32 and 24 and qwen3-8b batch 32 (timelines at 32)
#   agentic: the agentic-workload bench (its transformers peers included), on the final tree
# (probe and rows16 ran on 54777b3 and its next commit, with three more wide configurations since dropped --
# 1024-column chunks at 16 rows, 4 stages at 32 rows, 2 tiles a stage at 1 CTA a multiprocessor: the variant
# lists below name only those still built; probe_blas.py skips the configurations not built.)
source benches/gpu/_env.sh
mode=${1:-probe}
shift
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
if [ "$mode" = probe ]; then
  checks 150 check_kernels_wide.log ${CHECKS:-staged staged_wide}
  timeout 100 python3 benches/gpu/probe_blas.py --reps 20 --no-lt --swiglu --ms 8 16 32 \
    --staged 1024:3:16:2 512:4:16:3 512:4:16:2 512:3:16:3 512:2:16:2:2 512:3:16:1:2 > "$OUT/probe_blas_wide.log" 2>&1
  echo "probe_blas rc=$?"; cat "$OUT/probe_blas_wide.log" | cut -c1-400
  timeout 220 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 32 --profile-batches \
    --timeline-batches 32 --rounds 3 --variants ${V32:-wide0 w32-512x3 w32-t2 w32-nohead} \
    > "$OUT/profile_wide_8b_b32.log" 2>&1
  echo "profile 8b b32 rc=$?"; grep -E "^\s+32 +" "$OUT/profile_wide_8b_b32.log"
  grep -E "graph timeline|^\s+[0-9]+x" "$OUT/profile_wide_8b_b32.log" | cut -c1-120 | head -30
fi
if [ "$mode" = rows16 ]; then
  [ -n "$PROBE" ] && { timeout 100 python3 benches/gpu/probe_blas.py --reps 20 --no-lt --swiglu --ms 8 16 32 \
    --staged 1024:3:16:2 512:4:16:3 512:4:16:2 512:3:16:3 512:2:16:2:2 512:3:16:1:2 > "$OUT/probe_blas_wide.log" 2>&1
  echo "probe_blas rc=$?"; cut -c1-400 "$OUT/probe_blas_wide.log"; }
  timeout 170 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 16 --profile-batches \
    --timeline-batches 16 --rounds 3 --variants ${V16:-wide0 w16-512x2 w16-512x3} \
    > "$OUT/profile_wide_8b_b16.log" 2>&1
  echo "profile 8b b16 rc=$?"; grep -E "^\s+16 +" "$OUT/profile_wide_8b_b16.log"
  grep -E "graph timeline|^\s+[0-9]+x" "$OUT/profile_wide_8b_b16.log" | cut -c1-120 | head -60
  timeout 170 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 16 32 --profile-batches \
    --rounds 3 --variants ${V06:-wide0 w16-512x3 w32-512x3 w32-t2} > "$OUT/profile_wide_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+(16|32) +" "$OUT/profile_wide_06b.log"
fi
if [ "$mode" = rows32 ]; then
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 32 24 --profile-batches \
    --timeline-batches 32 --rounds 3 --variants default w32-lim w32-t2lim w32-qo > "$OUT/profile_wide32_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+(32|24) +" "$OUT/profile_wide32_06b.log"
  grep -E "graph timeline|^\s+[0-9]+x" "$OUT/profile_wide32_06b.log" | cut -c1-120 | head -60
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 32 --profile-batches \
    --rounds 3 --variants default w32-lim w32-qo > "$OUT/profile_wide32_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -E "^\s+32 +" "$OUT/profile_wide32_8b.log"
fi
if [ "$mode" = rule ]; then
  timeout 170 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 16 12 --profile-batches \
    --timeline-batches 16 --rounds 3 --variants default wide0 w16-512x3 > "$OUT/profile_wide_rule_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -E "^\s+1[26] +" "$OUT/profile_wide_rule_8b.log"
  grep -E "graph timeline|^\s+[0-9]+x" "$OUT/profile_wide_rule_8b.log" | cut -c1-120 | head -45
  timeout 90 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 16 12 --profile-batches \
    --rounds 3 --variants default wide0 w16-512x3 > "$OUT/profile_wide_rule_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+1[26] +" "$OUT/profile_wide_rule_06b.log"
  checks 120 check_kernels_wide_final.log ${CHECKS:-staged staged_wide graph}
  smoke 80
  conformance_both 150 conformance_gpu_qwen3-8b_wide.log 200
fi
if [ "$mode" = agentic ]; then
  run_benches 280 "agentic"
  pack_bench
fi
