#!/usr/bin/env bash
# Twentieth session's device calls: cuBLAS's GEMM kernels behind programmatic edges in the decode graphs
# (CudaRunner.blas_pdl; run from the repository root):
#   bash benches/gpu/h200_blas_pdl_round.sh MODE
#   probe:  probe_blas_pdl.py (does each cuBLAS GEMM kernel of the decode steps wait on the grid dependency; the
#           engine's tokens and logprob bits with blas_pdl off and on), then the engine A/B in one process
#           (profile_decode.py: default against blas-pdl) at qwen3-0.6b batch 32 and 64 after a 256-token prompt
#           and at batch 64 after 1664 tokens (the agentic workload's second turn; graph timelines), and at
#           qwen3-8b batch 32 and 64
#   ab:     probe_blas_pdl.py --only engine (the engine's outputs with the edges rewritten), then the A/B of the
#           default against qk-all (qk_norm_rope in the attention launch at any batch) and lt (torch's cuBLASLt
#           path) at the same shapes
#   lt:     (the decode GEMMs on cuBLAS captured through torch's cuBLASLt path, CudaRunner.decode_blas) the default
#           against blas-cublas (torch's cuBLAS path) at qwen3-8b batch 16-256 (graph timelines at 32) and qwen3-0.6b
#           batch 32-256
#   final:  (the kept rule: cuBLASLt at 17-64 rows) the default against blas-cublas at qwen3-8b batch 16, 32, 48 and 64;
#           the engine decode bench; the engine smoke test; conformance at CI scale beside the GPU-scale qwen3-8b
#           clauses
#   cluster: the cluster kernel (skinny_cluster_*, 17-64 rows): check_kernels.py --only cluster, probe_blas.py at 32
#           and 64 rows (qwen3-0.6b and qwen3-8b shapes), then the engine A/B (profile_decode.py: default against the
#           cl-* variants) at qwen3-0.6b batch 32 and 64 (timelines at 64), batch 64 after 1664 tokens, qwen3-8b
#           batch 32 and 64
source benches/gpu/_env.sh
mode=${1:-probe}
shift
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
if [ "$mode" = probe ]; then
  timeout 200 python3 benches/gpu/probe_blas_pdl.py --out "$OUT" > "$OUT/probe_blas_pdl.log" 2>&1
  echo "probe_blas_pdl rc=$?"
  grep -vE "^ +qwen" "$OUT/probe_blas_pdl.log" | cut -c1-300 | tail -40
  grep -E "NO WAIT|MIXED|NO POWER|neither" "$OUT/probe_blas_pdl.log" | head -10
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 32 64 --profile-batches \
    --timeline-batches 64 --rounds 3 --variants default blas-pdl > "$OUT/profile_blas_pdl_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+(32|64) +" "$OUT/profile_blas_pdl_06b.log"
  grep -E "graph timeline|^\s+[0-9]+x" "$OUT/profile_blas_pdl_06b.log" | cut -c1-120 | head -30
  timeout 120 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 64 --prompt 1664 --profile-batches \
    --timeline-batches 64 --rounds 3 --variants default blas-pdl > "$OUT/profile_blas_pdl_06b_1664.log" 2>&1
  echo "profile 0.6b 1664 rc=$?"; grep -E "^\s+64 +" "$OUT/profile_blas_pdl_06b_1664.log"
  grep -E "graph timeline|^\s+[0-9]+x" "$OUT/profile_blas_pdl_06b_1664.log" | cut -c1-120 | head -30
  timeout 200 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 32 64 --profile-batches \
    --rounds 3 --variants default blas-pdl > "$OUT/profile_blas_pdl_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -E "^\s+(32|64) +" "$OUT/profile_blas_pdl_8b.log"
fi
if [ "$mode" = ab ]; then
  timeout 200 python3 benches/gpu/probe_blas_pdl.py --only engine > "$OUT/probe_blas_pdl_engine.log" 2>&1
  echo "probe_blas_pdl engine rc=$?"; tail -6 "$OUT/probe_blas_pdl_engine.log" | cut -c1-300
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 32 64 --profile-batches \
    --timeline-batches 64 --rounds 3 --variants default qk-all lt > "$OUT/profile_rows_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+(32|64) +" "$OUT/profile_rows_06b.log"
  timeout 120 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 64 --prompt 1664 --profile-batches \
    --rounds 3 --variants default qk-all lt > "$OUT/profile_rows_06b_1664.log" 2>&1
  echo "profile 0.6b 1664 rc=$?"; grep -E "^\s+64 +" "$OUT/profile_rows_06b_1664.log"
  timeout 200 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 32 64 --profile-batches \
    --rounds 3 --variants default qk-all lt > "$OUT/profile_rows_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -E "^\s+(32|64) +" "$OUT/profile_rows_8b.log"
fi
if [ "$mode" = lt ]; then
  timeout 260 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 16 32 64 128 256 --profile-batches \
    --timeline-batches 32 --rounds 3 --variants default blas-cublas > "$OUT/profile_lt_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -E "^\s+[0-9]+ +(default|blas-)" "$OUT/profile_lt_8b.log"
  grep -E "graph timeline|^\s+[0-9]+x" "$OUT/profile_lt_8b.log" | cut -c1-120 | head -30
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 32 64 128 256 --profile-batches \
    --rounds 3 --variants default blas-cublas > "$OUT/profile_lt_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+[0-9]+ +(default|blas-)" "$OUT/profile_lt_06b.log"
fi
if [ "$mode" = final ]; then
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 16 32 48 64 --profile-batches \
    --rounds 3 --variants default blas-cublas > "$OUT/profile_lt_rule_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -E "^\s+[0-9]+ +(default|blas-)" "$OUT/profile_lt_rule_8b.log"
  run_benches 300 "engine_decode"
  pack_bench
  smoke 80
  conformance_both 200 conformance_gpu_qwen3-8b_lt.log 250
fi
if [ "$mode" = cluster ]; then
  timeout 90 python3 benches/gpu/check_kernels.py --only cluster > "$OUT/check_kernels_cluster.log" 2>&1
  rc=$?; echo "check_kernels cluster rc=$rc"; grep -E "FAIL" "$OUT/check_kernels_cluster.log" | head -20
  tail -3 "$OUT/check_kernels_cluster.log"
  [ $rc -ne 0 ] && exit 1   # (a hang or a wrong bit: nothing after it is worth the device time)
  timeout 100 python3 benches/gpu/probe_blas.py --reps 20 --no-lt --swiglu --cluster --model qwen3-0.6b --ms 32 64 \
    > "$OUT/probe_blas_cluster_06b.log" 2>&1; echo "probe_blas 0.6b rc=$?"; cut -c1-330 "$OUT/probe_blas_cluster_06b.log"
  timeout 100 python3 benches/gpu/probe_blas.py --reps 20 --no-lt --cluster --ms 32 64 \
    > "$OUT/probe_blas_cluster_8b.log" 2>&1; echo "probe_blas 8b rc=$?"; cut -c1-330 "$OUT/probe_blas_cluster_8b.log"
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 32 64 --profile-batches \
    --timeline-batches 64 --rounds 3 --variants default cl-t2 cl-t1 cl-qg > "$OUT/profile_cluster_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+(32|64) +" "$OUT/profile_cluster_06b.log"
  grep -E "graph timeline|^\s+[0-9]+x" "$OUT/profile_cluster_06b.log" | cut -c1-120 | head -56
  timeout 100 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 64 --prompt 1664 --profile-batches \
    --rounds 3 --variants default cl-t2 > "$OUT/profile_cluster_06b_1664.log" 2>&1
  echo "profile 0.6b 1664 rc=$?"; grep -E "^\s+64 +" "$OUT/profile_cluster_06b_1664.log"
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 32 64 --profile-batches \
    --rounds 3 --variants default cl-lim > "$OUT/profile_cluster_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -E "^\s+(32|64) +" "$OUT/profile_cluster_8b.log"
fi
