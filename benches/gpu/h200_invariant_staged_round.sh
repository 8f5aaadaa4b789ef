#!/usr/bin/env bash
# Thirty-fourth session: gemm.cu's staged kernel, the batch-invariant GEMM's decode rows (docs/performance/batch_invariant.md,
# "The staged kernel of the batch-invariant GEMM"). One device call, from the repository root:
#   bash benches/gpu/h200_invariant_staged_round.sh
# First, side by side and untimed: check_kernels.py's gemm and invariant sections (every GEMM kernel bitwise
# against every other), the engine smoke test and the GPU-scale conformance clauses of batch-invariant mode
# (INVARIANT, TURN, SAMPLE at the qwen3-0.6b shape). Then, alone on the GPU: probe_gemm_staged.py (every kernel
# at the decode GEMMs of qwen3-8b and qwen3-0.6b, M = 1, 8, 16, 32), and the benches invariant_overhead and
# kernel_gemm (reports in bench_invariant.tgz). TAG: the logs' suffix (default _staged); CONF=0 leaves out the
# conformance clauses, PROBE=0 the probe.
source benches/gpu/_env.sh
tag=${TAG:-_staged}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
( checks 280 check_kernels_gemm$tag.log gemm invariant ) > "$OUT/checks.summary" &
( smoke 240 ) > "$OUT/smoke.summary" &
[ "${CONF:-1}" = 1 ] && conformance_gpu 330 "qwen3-0.6b and (invariant or turn or sample)" \
  "conformance_gpu_qwen3-0.6b$tag.log"
wait; cat "$OUT/checks.summary" "$OUT/smoke.summary"; rm -f "$OUT/checks.summary" "$OUT/smoke.summary"
mv "$OUT/engine_smoke.log" "$OUT/engine_smoke$tag.log"
if [ "${PROBE:-1}" = 1 ]; then
  timeout 300 python3 benches/gpu/probe_gemm_staged.py --json "$OUT/probe_gemm_staged$tag.json" \
    > "$OUT/probe_gemm_staged$tag.log" 2>&1
  echo "probe_gemm_staged rc=$?"; grep -E "DIFFER|Error|error|bitwise" "$OUT/probe_gemm_staged$tag.log" | head
fi
bench_packed 330 "invariant_overhead or kernel_gemm" "run_gpu_invariant$tag.log"
mv "$OUT/bench.tgz" "$OUT/bench_invariant.tgz"
exit 0
