#!/usr/bin/env bash
# Fourteenth session's device calls on the decode step's GEMMs (run from the repository root):
#   bash benches/gpu/h200_blas_round.sh MODE
#   probe:  probe_blas.py (the qwen3-8b decode GEMMs and the LM head at M = 1 and 8: torch.matmul, torch's
#           cuBLASLt path, the transposed problem, our skinny kernel; weights from DRAM), then the engine A/B
#           in one process (profile_decode.py --variants default lt: the whole step with torch's BLAS
#           preference set to cuBLASLt while its graphs are captured), qwen3-8b batch 1, 8, 32 and
#           qwen3-0.6b batch 1, 64
#   skinny: check_kernels.py --only skinny epilogue (the skinny kernels' new prefetch switch: bits equal with it
#           off), then the engine A/B of qwen3-8b's o_proj and down on the skinny kernel, o_proj with and without
#           its L2 prefetch before the PDL wait, at batch 1 and 8, and o_proj's prefetch off at qwen3-0.6b
#           batch 1 and 8 (the variant names of that call: "skinny-n4096" is today's pf-o, "sn-np-o" the
#           default, "skinny-np-o" qwen3-0.6b's np-o)
#   final:  the engine smoke test, the engine decode bench (its transformers peer included), then the GPU-scale
#           qwen3-8b conformance clauses beside conformance at CI scale on the optimized engine
# Two calls between were one device line each (in benches/results/latest.md): profile_decode.py's variants
# default skinny-n4096 "skinny<=16M" (h200/profile_skinny_n_8b.log) and default sn-off n6144 pf-o
# (h200/profile_skinny_rule_8b.log).
source benches/gpu/_env.sh
mode=${1:-probe}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
if [ "$mode" = probe ]; then
  timeout 150 python3 benches/gpu/probe_blas.py --reps 20 > "$OUT/probe_blas.log" 2>&1
  echo "probe rc=$?"; cat "$OUT/probe_blas.log"
  timeout 240 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 1 8 32 --profile-batches \
    --timeline-batches 1 --rounds 3 --variants default lt > "$OUT/profile_blas_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -vE "^\s+[0-9]+x" "$OUT/profile_blas_8b.log"
  grep -E "^\s+[0-9]+x" "$OUT/profile_blas_8b.log" | cut -c1-110
  timeout 120 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 1 64 --profile-batches \
    --rounds 3 --variants default lt > "$OUT/profile_blas_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; cat "$OUT/profile_blas_06b.log"
fi
if [ "$mode" = skinny ]; then
  checks 150 check_kernels_skinny_prefetch.log skinny epilogue
  timeout 300 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 1 8 --profile-batches \
    --timeline-batches 1 --rounds 3 --variants default pf-o np-o > "$OUT/profile_skinny_np_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -vE "^\s+[0-9]+x" "$OUT/profile_skinny_np_8b.log"
  grep -E "^\s+[0-9]+x" "$OUT/profile_skinny_np_8b.log" | cut -c1-110
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 1 8 --profile-batches \
    --timeline-batches 1 --rounds 3 --variants default np-o > "$OUT/profile_skinny_np_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -vE "^\s+[0-9]+x" "$OUT/profile_skinny_np_06b.log"
  grep -E "^\s+[0-9]+x" "$OUT/profile_skinny_np_06b.log" | cut -c1-110 | head -30
fi
if [ "$mode" = final ]; then
  smoke 100
  run_benches 240 "engine_decode"
  pack_bench
  conformance_gpu 280 qwen3-8b conformance_gpu_qwen3-8b_skinny.log > "$OUT/c8.summary" &
  conformance_ci 300
  wait
  cat "$OUT/c8.summary"; rm -f "$OUT/c8.summary"
fi
