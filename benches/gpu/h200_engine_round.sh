#!/usr/bin/env bash
# Two device calls of an engine round (files under $OUT):
#   bash benches/gpu/h200_engine_round.sh benches   # the attention labs and engine_decode (reports packed into
#                                                    # $OUT/bench.tgz: a device call returns few files), then the
#                                                    # host enqueue probe
#   bash benches/gpu/h200_engine_round.sh checks    # check_kernels.py + engine_smoke.py + the conformance suite at
#                                                    # CI scale, beside the qwen3-0.6b GPU-scale conformance run
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
build_kernels
if [ "${1:-benches}" = benches ]; then
  run_benches 330 "kernel_decode or kernel_prefill or engine_decode"
  pack_bench
  timeout 60 python3 benches/gpu/probe_kernels.py --only host --reps 50 > "$OUT/host_overhead.log" 2>&1
  echo "host probe rc=$?"; grep "host enqueue" "$OUT/host_overhead.log"
  exit 0
fi
ARGS=(-q -rs -p no:cacheprovider --engine optimized --durations=12)
( timeout 150 python3 benches/gpu/check_kernels.py > "$OUT/check_kernels.log" 2>&1; echo "check_kernels rc=$?"
  timeout 90 python3 benches/gpu/engine_smoke.py > "$OUT/engine_smoke.log" 2>&1; echo "engine_smoke rc=$?"
  timeout 240 python3 -m pytest conformance "${ARGS[@]}" > "$OUT/conformance_ci_optimized.log" 2>&1
  echo "conformance ci rc=$?" ) &
( timeout 500 python3 -m pytest conformance "${ARGS[@]}" --conformance-scale gpu --oracle-device cuda -k qwen3-0.6b \
  > "$OUT/conformance_gpu_qwen3-0.6b.log" 2>&1; echo "conformance qwen3-0.6b rc=$?" ) &
wait
grep -E "passed, .* failed" "$OUT/check_kernels.log"; grep -E "^\[(ok|FAIL)|FAILED" "$OUT/engine_smoke.log"
for f in conformance_ci_optimized conformance_gpu_qwen3-0.6b; do
  echo "== $f"; grep -E "CONFORMANCE FAILURE|^FAILED" "$OUT/$f.log" | head -8; tail -1 "$OUT/$f.log"
done
