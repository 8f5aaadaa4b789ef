#!/usr/bin/env bash
# Fourteenth session's device calls (run from the repository root): bash benches/gpu/h200_l2_round.sh MODE
#   first:  the L2 prefetch of cuBLAS GEMMs' weights on a side stream (prefetch.cu, CudaRunner._fork_prefetch):
#           the engine smoke test (its l2_prefetch_changes_nothing section: bitwise the same rollouts with the
#           prefetch on, either kind, and off), the kernel-level probe (probe_prefetch.py: a spin standing for the
#           kernels before each qwen3-8b GEMM, the GEMM after it with and without the prefetch), then the engine
#           A/B in one process (profile_decode.py: the engine's default against the prefetch off and changed,
#           alternating rounds; qwen3-8b batch 1, 8, 16, 32 with the batch-1 graph timeline, qwen3-0.6b batch 1, 16)
#           (the first call ran this on the tree whose default asked for the heads of qkv's, gate/up's, down's and
#           the LM head's weights too, 12 MiB each, and whose bulk kernel packed 128 pieces into each CTA)
#   second: the same checks, probe and A/Bs after the bulk kernel's pieces were spread over every multiprocessor
#           and the default narrowed to o_proj's weights (variants: the per-line kernel, the heads again, batch <= 8)
#   benches: the engine decode bench (its transformers peer included) and the small kernels' lab, then
#           conformance at CI scale on the optimized engine
source benches/gpu/_env.sh
mode=${1:-first}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
if [ "$mode" = first ]; then
  smoke 200
  timeout 120 python3 benches/gpu/probe_prefetch.py --reps 30 > "$OUT/probe_prefetch.log" 2>&1
  echo "probe rc=$?"; cat "$OUT/probe_prefetch.log"
  timeout 330 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 1 8 16 32 --profile-batches \
    --timeline-batches 1 --rounds 3 --variants default pf-off pf-lines pf-o pf-x2 pf-half \
    > "$OUT/profile_prefetch_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -vE "^\s+[0-9]+x" "$OUT/profile_prefetch_8b.log"; grep -E "l2_prefetch|gemv|gemm|Kernel|sm90" "$OUT/profile_prefetch_8b.log" | head -40
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 1 16 --profile-batches \
    --rounds 3 --variants default pf-off > "$OUT/profile_prefetch_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; cat "$OUT/profile_prefetch_06b.log"
fi
if [ "$mode" = second ]; then
  smoke 200
  timeout 120 python3 benches/gpu/probe_prefetch.py --reps 30 > "$OUT/probe_prefetch_spread.log" 2>&1
  echo "probe rc=$?"; cat "$OUT/probe_prefetch_spread.log"
  timeout 300 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 1 8 16 --profile-batches \
    --timeline-batches 1 --rounds 3 --variants default pf-off pf-lines pf-heads pf-heads2 pf-b8 \
    > "$OUT/profile_prefetch_8b_spread.log" 2>&1
  echo "profile 8b rc=$?"; grep -vE "^\s+[0-9]+x" "$OUT/profile_prefetch_8b_spread.log"
  grep -E "l2_prefetch|split_kv|nvjet_sm90_tst_64x8_64x16_2x1" "$OUT/profile_prefetch_8b_spread.log" | head -30
  timeout 120 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 1 16 --profile-batches \
    --rounds 3 --variants default pf-off > "$OUT/profile_prefetch_06b_spread.log" 2>&1
  echo "profile 0.6b rc=$?"; cat "$OUT/profile_prefetch_06b_spread.log"
fi
if [ "$mode" = benches ]; then
  run_benches 420 "engine_decode or kernel_small"
  pack_bench
  conformance_ci 330
fi
