#!/usr/bin/env bash
# Device calls written in the forty-first session (which was lent no device machine; run from the repository root),
# to decide whether the prefill graphs go on by default (runner.prefill_graph_max_tokens = 256 with graphs), in
# order of worth:
#   bash benches/gpu/h200_fortyfirst_round.sh first    # the conformance suite on the optimized engine with the
#                                                       # prefill graphs on, each run through count_prefill_graphs.py
#                                                       # (its log says how many prefill steps replayed a graph),
#                                                       # concurrently: the CI scale, then the engine smoke test and
#                                                       # check_kernels.py (every section); the GPU scale's TURN tests
#                                                       # (every shape); the GPU scale's qwen3-8b subset (H200 only),
#                                                       # then its other qwen3-0.6b tests
#   bash benches/gpu/h200_fortyfirst_round.sh second   # the trickle bench (test_agentic_trickle: 1 and 4 sequences a
#                                                       # hand-over, eager and from prefill graphs), the fortieth
#                                                       # session's trickle A/B again (its eager engine's second round
#                                                       # was 1.15 s slower: now with each run's process CPU time and
#                                                       # GC time), the prefill A/B on the agentic
#                                                       # bench's workload (even chunks with and without the prefill
#                                                       # graphs)
#   bash benches/gpu/h200_fortyfirst_round.sh rest     # invariant_overhead, group_sharing, host_overhead
#   bash benches/gpu/h200_fortyfirst_round.sh third    # (forty-second session) the agentic bench, whose records now
#                                                       # carry the workload's floor (turn_floors), and the engine
#                                                       # decode bench; their floors.md is in bench_agentic.tgz
# `first` passed in parts (forty-fifth session: its NaN fixed, the TURN tests; forty-sixth session:
# h200_fortysixth_round.sh ci8b and rest), and the prefill graphs are on by default for engines on graphs since then.
# TAG: the logs' suffix (default _MODE).
source benches/gpu/_env.sh
mode=${1:-first}
tag=${TAG:-_$mode}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
date +%T; build_kernels; date +%T


if [ "$mode" = first ]; then
  mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  ( conf 150 "conformance_ci$tag.log"; smoke 130; mv "$OUT/engine_smoke.log" "$OUT/engine_smoke$tag.log"
    checks 200 "check_kernels$tag.log" ) > "$OUT/ci.summary" &
  ( conf 450 "conformance_gpu_turn$tag.log" --conformance-scale gpu --oracle-device cuda -k test_turn ) \
    > "$OUT/turn.summary" &
  if [ "${mem:-0}" -ge 100000 ]; then      # the qwen3-8b subset peaks at 70-90 GB: beside the others on an H200 only
    conf 150 "conformance_gpu_qwen3-8b$tag.log" --conformance-scale gpu --oracle-device cuda -k qwen3-8b
  else
    echo "qwen3-8b conformance skipped: ${mem} MiB of GPU memory"
  fi
  conf 280 "conformance_gpu_qwen3-0.6b$tag.log" --conformance-scale gpu --oracle-device cuda \
    -k "qwen3-0.6b and not test_turn"
  wait; cat "$OUT/ci.summary" "$OUT/turn.summary"; rm -f "$OUT/ci.summary" "$OUT/turn.summary"
fi
if [ "$mode" = second ]; then
  bench_packed 150 "agentic_trickle" "run_gpu_trickle$tag.log"; mv "$OUT/bench.tgz" "$OUT/bench_trickle.tgz"
  timeout 120 python3 benches/gpu/profile_agentic.py --no-profile --trickle-ab 2 --trickle 3 31 1 2 --out "$OUT" \
    > "$OUT/profile_agentic_trickle_one$tag.log" 2>&1
  echo "trickle one rc=$?"; grep -E "^trickle A/B|Error" "$OUT/profile_agentic_trickle_one$tag.log" | tail -3
  mv "$OUT/profile_agentic.json" "$OUT/profile_agentic_trickle_one$tag.json" 2>/dev/null
  timeout 230 python3 benches/gpu/profile_agentic.py --no-profile --prefill-ab 2 --prefill-variants even,even+graphs \
    --out "$OUT" > "$OUT/profile_agentic_prefill_ab$tag.log" 2>&1
  echo "prefill A/B rc=$?"; grep -E "^prefill A/B|Error" "$OUT/profile_agentic_prefill_ab$tag.log" | tail -6
  mv "$OUT/profile_agentic.json" "$OUT/profile_agentic_prefill_ab$tag.json" 2>/dev/null
fi
if [ "$mode" = rest ]; then   # (forty-second session: out of second, whose timeouts summed past a call's 600 s)
  bench_packed 170 "invariant_overhead or group_sharing or host_overhead" "run_gpu_rest$tag.log"
  mv "$OUT/bench.tgz" "$OUT/bench_rest.tgz"
fi
if [ "$mode" = third ]; then
  bench_packed 420 "(test_agentic and not trickle) or engine_decode" "run_gpu_agentic$tag.log"
  mv "$OUT/bench.tgz" "$OUT/bench_agentic.tgz"
  grep -E "^\[(MET |miss)\]" "$OUT/run_gpu_agentic$tag.log"
fi
exit 0
