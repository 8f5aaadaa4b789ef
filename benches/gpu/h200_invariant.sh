#!/usr/bin/env bash
# One device call for batch-invariant mode (logs under $OUT): the GEMM / invariant-attention /
# fused-RoPE kernel checks, the engine smoke check, then (alone on the GPU, for timing) the
# batch-invariant overhead bench and the GEMM kernel lab.
#   bash benches/gpu/h200_invariant.sh
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
build_kernels
( timeout 200 python3 benches/gpu/check_kernels.py --only gemm invariant fused_rope > "$OUT/check_kernels_invariant.log" 2>&1
  echo "check_kernels rc=$?" ) &
( timeout 200 python3 benches/gpu/engine_smoke.py > "$OUT/engine_smoke.log" 2>&1; echo "engine_smoke rc=$?" ) &
wait
grep -E "FAIL|passed, .* failed" "$OUT/check_kernels_invariant.log" | tail -20
grep -E "^\[(ok|FAIL)|FAILED|batch mates|single-shot|fused" "$OUT/engine_smoke.log"
timeout 330 bash benches/run_gpu.sh -k "invariant_overhead or kernel_gemm" > "$OUT/bench_invariant.log" 2>&1
echo "bench rc=$?"; grep -E "^\[(met|miss)\]|passed|failed" "$OUT/bench_invariant.log" | tail -12
