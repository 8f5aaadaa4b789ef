#!/usr/bin/env bash
# Device call of the forty-fifth session (run from the repository root), after the fix of the prefill graphs' NaN
# (optimized/runner.py, _run_prefill_graph: the graph's pinned inputs are written again only once their last upload
# has been read; docs/performance/agentic.md, "Forty-fifth session"):
#   bash benches/gpu/h200_fortyfifth_round.sh
# runs `h200_fortyfirst_round.sh first` (TAG=_fixed: the conformance suite with the prefill graphs on, four
# processes) and beside it, once the qwen3-8b subset is done (H200) or after the build (H100), the four TURN tests
# that failed with NaN under debug_prefill_graphs.py's `base` variant (benches/gpu/h200_fortyfourth_round.sh nan).
source benches/gpu/_env.sh
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
