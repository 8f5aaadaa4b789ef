#!/usr/bin/env bash
# Device calls of the forty-fourth session (run from the repository root):
#   bash benches/gpu/h200_fortyfourth_round.sh nan   # four of the five TURN tests that failed with the prefill graphs on
#                                                     # (h200_fortyfirst_round.sh first: NaN logprobs), under
#                                                     # debug_prefill_graphs.py's variants side by side (the
#                                                     # forty-fourth session's; next: VARIANTS="base sync-start
#                                                     # after no-copy-stream eager-closure", five processes, the
#                                                     # crowd the failure needed; forty-fifth session: VARIANTS=
#                                                     # "trace stream-sync-start sync-end sleep-start quiet"; the cause
#                                                     # found and fixed: h200_fortyfifth_round.sh)
#   bash benches/gpu/h200_fortyfourth_round.sh holes # sync (below) with VARIANTS=holes: the KV-cache canary check
#   bash benches/gpu/h200_fortyfourth_round.sh sync  # two of those tests (mha-d16, gqa8-d128), one process each,
#                                                     # under base, sync-start, after, no-copy-stream (VARIANTS=...)
#                                                     # (one variant at a time, its two tests side by side)
source benches/gpu/_env.sh
mode=${1:-nan}
if [ "$mode" = holes ]; then mode=sync; VARIANTS=holes; fi   # (the sync mode's loop, one variant)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date +%T; build_kernels; date +%T
sel="(test_batch_compositions and (mha-d16 or qwen3-0.6b-untied)) or (test_observations_spanning_many_blocks and (gqa4-d64 or gqa8-d128))"
if [ "$mode" = nan ]; then
  nan_variants=${VARIANTS:-base no-lookahead eager-closure own-pool no-pdl}
  for v in $nan_variants; do
    pdl=1; [ "$v" = no-pdl ] && pdl=0
    ( TURNKV_PDL=$pdl timeout 330 python3 benches/gpu/debug_prefill_graphs.py "$v" conformance/test_turn.py -q -s \
        -p no:cacheprovider --engine optimized --conformance-scale gpu --oracle-device cuda -k "$sel" \
        > "$OUT/debug_prefill_$v.log" 2>&1; echo "== $v rc=$?" ) &
  done
  wait
  for v in $nan_variants; do
    echo "== $v"; grep -E "^variant|^holes:|^unwritten|passed|failed" "$OUT/debug_prefill_$v.log" | tail -4
    grep -E "^NaN step|^  " "$OUT/debug_prefill_$v.log" | grep -v -E "repro|eng\.|sp[0-9]|cfg|out =|gen =|traj|from conformance|#" | head -24
  done
fi
if [ "$mode" = sync ]; then
  for v in ${VARIANTS:-base sync-start after no-copy-stream}; do
    for t in "test_batch_compositions and mha-d16" "test_observations_spanning_many_blocks and gqa8-d128"; do
      ( timeout 80 python3 benches/gpu/debug_prefill_graphs.py $v conformance/test_turn.py -q -s -p no:cacheprovider \
          --engine optimized --conformance-scale gpu --oracle-device cuda -k "$t" > "$OUT/debug_${v}_${t##* }.log" 2>&1
        echo "== $v $t rc=$?" ) &
    done
    wait
    for f in "$OUT"/debug_${v}_*.log; do
      grep -E "^(hole|unwritten|holes:|variant|NaN step)|passed|failed|^  (tickets|eager step: first)|canary at [0-9]" \
        "$f" | cut -c1-300 | head -16
    done
  done
fi
exit 0
