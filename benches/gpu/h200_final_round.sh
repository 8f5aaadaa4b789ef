#!/usr/bin/env bash
# Thirty-third session's device calls: the final tree's checks and every bench of the suite in one session's runs, so
# that each target of issue 5 has a figure from the same tree (docs/performance.md, "Targets of issue 5 at a glance";
# run from the repository root):
#   bash benches/gpu/h200_final_round.sh checks   # check_kernels.py (every section), the engine smoke test and the
#                                                 # conformance suite at CI scale on the optimized engine, concurrently
#                                                 # (nothing is timed), then the kernel labs: kernel_decode,
#                                                 # kernel_prefill, kernel_small, kernel_gemm (reports in bench_labs.tgz)
#   bash benches/gpu/h200_final_round.sh engine   # the engine benches engine_decode and agentic, and kernel_gemm
#                                                 # again (the checks call found its staged rows broken:
#                                                 # CudaRunner._staged_kw) (reports in bench_engine.tgz)
#   bash benches/gpu/h200_final_round.sh rest     # invariant_overhead, group_sharing, host_overhead (bench_rest.tgz)
# Each bench group measures the ceilings (copy, bf16 GEMM) in its own run. TAG: the logs' suffix (default _MODE).
source benches/gpu/_env.sh
mode=${1:-checks}
tag=${TAG:-_$mode}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
if [ "$mode" = checks ]; then
  ( checks 400 check_kernels_final$tag.log ) > "$OUT/checks.summary" &
  ( smoke 200 ) > "$OUT/smoke.summary" &
  conformance_ci 280   # conformance_ci_optimized.log
  wait; cat "$OUT/checks.summary" "$OUT/smoke.summary"; rm -f "$OUT/checks.summary" "$OUT/smoke.summary"
  mv "$OUT/conformance_ci_optimized.log" "$OUT/conformance_ci_optimized_final$tag.log"
  mv "$OUT/engine_smoke.log" "$OUT/engine_smoke_final$tag.log"
  bench_packed 300 "kernel_decode or kernel_prefill or kernel_small or kernel_gemm" run_gpu_labs_final$tag.log
  mv "$OUT/bench.tgz" "$OUT/bench_labs.tgz"
fi
if [ "$mode" = engine ]; then
  bench_packed 560 "engine_decode or agentic or kernel_gemm" run_gpu_engine_final$tag.log
  mv "$OUT/bench.tgz" "$OUT/bench_engine.tgz"
fi
if [ "$mode" = rest ]; then
  bench_packed 560 "invariant_overhead or group_sharing or host_overhead" run_gpu_rest_final$tag.log
  mv "$OUT/bench.tgz" "$OUT/bench_rest.tgz"
fi
exit 0
