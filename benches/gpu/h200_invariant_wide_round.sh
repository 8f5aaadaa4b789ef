#!/usr/bin/env bash
# Thirty-fifth session: gemm.cu's wide kernel, the batch-invariant GEMM at 17-128 decode rows (docs/performance/batch_invariant.md,
# "The wide kernel of the batch-invariant GEMM"). Device calls, from the repository root:
#   PART=check bash benches/gpu/h200_invariant_wide_round.sh   # checks, smoke, then the probe
#   PART=bench bash benches/gpu/h200_invariant_wide_round.sh   # conformance clauses, then the engine benches
#   PART=all bash benches/gpu/h200_invariant_wide_round.sh     # both in one call (the final one; its timeouts add up
#                                                              # past a 600 s call: CONF=0 or separate calls fit)
# check: side by side and untimed, check_kernels.py's gemm and invariant sections (every GEMM kernel bitwise
# against every other) and the engine smoke test; then, alone on the GPU, probe_gemm_staged.py at M = ROWS
# (default 8 16 32 64 128) on the decode GEMMs of qwen3-8b and qwen3-0.6b. bench: the GPU-scale conformance
# clauses of batch-invariant mode (INVARIANT, TURN, SAMPLE at the qwen3-0.6b shape; CONF=0 leaves them out), then
# the benches invariant_overhead and kernel_gemm alone (reports in bench_invariant.tgz). TAG: the logs' suffix.
source benches/gpu/_env.sh
tag=${TAG:-_wide}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
part=${PART:-check}
if [ "$part" = check ] || [ "$part" = all ]; then
  checks_beside_smoke 300 240 "$tag" gemm invariant
  timeout "${PROBE_SECS:-280}" python3 benches/gpu/probe_gemm_staged.py --rows ${ROWS:-8 16 32 64 128} \
    --json "$OUT/probe_gemm_wide$tag.json" > "$OUT/probe_gemm_wide$tag.log" 2>&1
  echo "probe_gemm_staged rc=$?"; grep -E "DIFFER|Error|error|bitwise" "$OUT/probe_gemm_wide$tag.log" | head
fi
if [ "$part" = bench ] || [ "$part" = all ]; then
  [ "${CONF:-1}" = 1 ] && conformance_gpu 330 "qwen3-0.6b and (invariant or turn or sample)" \
    "conformance_gpu_qwen3-0.6b$tag.log"
  bench_packed 330 "invariant_overhead or kernel_gemm" "run_gpu_invariant$tag.log"
  mv "$OUT/bench.tgz" "$OUT/bench_invariant.tgz"
fi
exit 0
