#!/usr/bin/env bash
# Device calls of the forty-fifth session (run from the repository root), after the fix of the prefill graphs' NaN
# (optimized/runner.py, _run_prefill_graph: the graph's pinned inputs are written again only once their last upload
# has been read; docs/performance/agentic.md, "Agentic workload", its forty-fifth session):
#   bash benches/gpu/h200_fortyfifth_round.sh fixed  # (ran in the forty-fifth session, H100) `h200_fortyfirst_round.sh
#                                                     # first` (TAG=_fixed: the conformance suite with the prefill
#                                                     # graphs on, four processes) and beside it, once the qwen3-8b
#                                                     # subset is done (H200) or after the build (H100), the four TURN
#                                                     # tests that failed with NaN, under debug_prefill_graphs.py's
#                                                     # `base` variant (h200_fortyfourth_round.sh nan)
#   bash benches/gpu/h200_fortyfifth_round.sh ci     # next: the CI-scale suite with the prefill graphs on, alone
#                                                     # (it timed out in `fixed`'s crowd with no failure)
#   bash benches/gpu/h200_fortyfifth_round.sh gpu    # next (an H200): the GPU scale's qwen3-8b subset, then its
#                                                     # other qwen3-0.6b tests, with the prefill graphs on
# (Forty-sixth session: ci and gpu ran as h200_fortysixth_round.sh ci8b and rest, passed, and the pending diff that
# turns the prefill graphs on by default was applied.)
source benches/gpu/_env.sh
mode=${1:-fixed}
if [ "$mode" = fixed ]; then
  mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  delay=100; [ "${mem:-0}" -ge 100000 ] && delay=230
  sel="(test_batch_compositions and (mha-d16 or qwen3-0.6b-untied)) or (test_observations_spanning_many_blocks and (gqa4-d64 or gqa8-d128))"
  ( sleep $delay
    timeout 300 python3 benches/gpu/debug_prefill_graphs.py base conformance/test_turn.py -q -s -p no:cacheprovider \
      --engine optimized --conformance-scale gpu --oracle-device cuda -k "$sel" > "$OUT/debug_prefill_base_fixed.log" 2>&1
    echo "== debug base (fixed) rc=$?" ) &
  TAG=_fixed bash benches/gpu/h200_fortyfirst_round.sh first
  wait
  grep -E "^variant|passed|failed" "$OUT/debug_prefill_base_fixed.log" | tail -3
  grep -E "^NaN step|^  (seq|trace)" "$OUT/debug_prefill_base_fixed.log" | head -12
  exit 0
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date +%T; build_kernels; date +%T
[ "$mode" = ci ] && conf 520 "conformance_ci_graphs.log"
if [ "$mode" = gpu ]; then
  conf 200 "conformance_gpu_qwen3-8b_graphs.log" --conformance-scale gpu --oracle-device cuda -k qwen3-8b
  conf 320 "conformance_gpu_qwen3-0.6b_graphs.log" --conformance-scale gpu --oracle-device cuda \
    -k "qwen3-0.6b and not test_turn"
fi
exit 0
