#!/usr/bin/env bash
# Device calls of the forty-sixth session (run from the repository root): the rest of the conformance suite with the
# prefill graphs on, after the forty-fifth session's fix of their NaN (h200_fortyfifth_round.sh ci and gpu, split
# so that each call fits in 600 s; the qwen3-8b subset needs an H200's memory):
#   bash benches/gpu/h200_fortysixth_round.sh ci8b   # the CI-scale suite beside the GPU scale's qwen3-8b subset
#   bash benches/gpu/h200_fortysixth_round.sh rest   # the GPU scale's other qwen3-0.6b tests beside check_kernels.py
#                                                    # (every section), then the engine smoke test
#   bash benches/gpu/h200_fortysixth_round.sh agentic  # with the prefill graphs on by default: the agentic bench
#                                                    # (not the trickle), its floors.md in bench_agentic.tgz
#   bash benches/gpu/h200_fortysixth_round.sh small  # the GPU scale's other tests on the five small shapes (not TURN,
#                                                    # not qwen3), which no run of the gate covered, with the prefill
#                                                    # graphs on (the default now); run in the forty-seventh session
#                                                    # (H100): 109 passed, 50 skipped
# Both passed (ci8b on an H100 and on an H200), and the forty-sixth session then applied the pending diff
# (benches/gpu/pending/prefill_graphs_default.diff, now gone) that turns the prefill graphs on by default.
source benches/gpu/_env.sh
mode=${1:-ci8b}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
date +%T; build_kernels; date +%T
if [ "$mode" = ci8b ]; then
  ( conf 480 "conformance_ci_graphs.log" ) > "$OUT/ci.summary" &
  conf 480 "conformance_gpu_qwen3-8b_graphs.log" --conformance-scale gpu --oracle-device cuda -k qwen3-8b
  wait; cat "$OUT/ci.summary"; rm -f "$OUT/ci.summary"
fi
if [ "$mode" = rest ]; then
  ( checks 420 "check_kernels_graphs.log" ) > "$OUT/checks.summary" &
  conf 420 "conformance_gpu_qwen3-0.6b_graphs.log" --conformance-scale gpu --oracle-device cuda \
    -k "qwen3-0.6b and not test_turn"
  wait; cat "$OUT/checks.summary"; rm -f "$OUT/checks.summary"
  timeout 120 python3 benches/gpu/engine_smoke.py > "$OUT"/engine_smoke.log 2>&1; echo "engine_smoke rc=$?"
  grep -E "^\[(ok|FAIL)|FAILED|Error" "$OUT"/engine_smoke.log | head -20
fi
if [ "$mode" = small ]; then
  conf 540 "conformance_gpu_small_graphs.log" --conformance-scale gpu --oracle-device cuda \
    -k "not test_turn and not qwen3"
fi
if [ "$mode" = agentic ]; then
  bench_packed 330 "test_agentic and not trickle" "run_gpu_agentic.log"
  mv "$OUT/bench.tgz" "$OUT/bench_agentic.tgz"
  grep -E "^\[(MET |miss)\]" "$OUT/run_gpu_agentic.log"
fi
date +%T
exit 0
