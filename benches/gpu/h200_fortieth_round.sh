#!/usr/bin/env bash
# Fortieth session's device calls (run from the repository root), in order of worth, so that a call cut short at its
# limit loses the least:
#   bash benches/gpu/h200_fortieth_round.sh first    # the trickle A/B (profile_agentic.py --trickle-ab: observations
#                                                     # handed over one sequence at a time; prefill steps eager and from
#                                                     # prefill graphs), the engine smoke test beside the conformance suite
#                                                     # at CI scale (untimed), the engine decode bench, the kernel labs
#   bash benches/gpu/h200_fortieth_round.sh second   # check_kernels.py (every section), the trickle A/B over groups of 4,
#                                                     # the agentic profile's cProfile of the resumed prefill steps, and
#                                                     # invariant_overhead, group_sharing, host_overhead
# TAG: the logs' suffix (default _MODE).
source benches/gpu/_env.sh
mode=${1:-first}
tag=${TAG:-_$mode}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels

# trickle NAME TURNS OBS GROUP STEPS: profile_agentic.py's trickle A/B alone, into $OUT/profile_agentic_trickle_NAME.*
trickle() {
  local name=$1; shift
  timeout 150 python3 benches/gpu/profile_agentic.py --no-profile --trickle-ab 2 --trickle "$@" --out "$OUT" \
    > "$OUT/profile_agentic_trickle_$name$tag.log" 2>&1
  echo "trickle $name rc=$?"; grep -E "^trickle A/B|Error" "$OUT/profile_agentic_trickle_$name$tag.log" | tail -3
  mv "$OUT/profile_agentic.json" "$OUT/profile_agentic_trickle_$name$tag.json" 2>/dev/null
}

if [ "$mode" = first ]; then
  trickle one 3 31 1 2
  ( smoke 200 ) > "$OUT/smoke.summary" &
  conformance_ci 280
  wait; cat "$OUT/smoke.summary"; rm -f "$OUT/smoke.summary"
  mv "$OUT/engine_smoke.log" "$OUT/engine_smoke$tag.log"; mv "$OUT/conformance_ci_optimized.log" "$OUT/conformance_ci$tag.log"
  bench_packed 200 engine_decode "run_gpu_engine$tag.log"; mv "$OUT/bench.tgz" "$OUT/bench_engine.tgz"
  bench_packed 150 "kernel_decode or kernel_prefill or kernel_small or kernel_gemm" "run_gpu_labs$tag.log"
  mv "$OUT/bench.tgz" "$OUT/bench_labs.tgz"
fi
if [ "$mode" = second ]; then
  checks 250 "check_kernels$tag.log"
  trickle four 3 63 4 4
  timeout 150 python3 benches/gpu/profile_agentic.py --turns 3 --cprofile --out "$OUT" > "$OUT/profile_agentic$tag.log" 2>&1
  echo "profile_agentic rc=$?"; grep -E "timed run|totals|_upload|tolist" "$OUT/profile_agentic$tag.log" | head -12
  mv "$OUT/profile_agentic.json" "$OUT/profile_agentic$tag.json" 2>/dev/null
  bench_packed 150 "invariant_overhead or group_sharing or host_overhead" "run_gpu_rest$tag.log"
  mv "$OUT/bench.tgz" "$OUT/bench_rest.tgz"
fi
exit 0
