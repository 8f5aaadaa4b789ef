#!/usr/bin/env bash
# Thirty-first session's device call: can a short remainder split fill the 8 slots that batch 32's one-split grid leaves
# empty (256 CTAs for 264 slots of two a multiprocessor)? (docs/performance/decode_attention.md, "Remainder splits at batch 32";
# run from the repository root):
#   bash benches/gpu/h200_split_slots_round.sh
# probe_decode_cudnn.py at 32 x 4k, 8k and 16k over shuffled pages (auto's one split also over pages in order) with
#   base: the engine's build, splits in the launch's default block order (split fastest), and
#   slow: -DTK_SPLIT_SLOWEST: the split the slowest grid index, so all 256 long splits are dispatched first,
# each with splits of ctx - 64 r keys (r = 1, 2, 4, 8: one long split and a remainder of r tiles a sequence, folded
# in the launch), beside cuDNN; three rounds. SHAPES, ROUNDS, SIZES override the defaults; TAG the files' suffix.
#   bash benches/gpu/h200_split_slots_round.sh checks
# the final tree's checks instead: check_kernels.py (every section), conformance at CI scale on the optimized engine,
# and the probe's checks only (--rounds 0) with both split options, so the script's launch helpers run once more
source benches/gpu/_env.sh
tag=${TAG:-}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
if [ "${1:-}" = checks ]; then
  timeout 300 python3 benches/gpu/check_kernels.py > "$OUT/check_kernels_split_slots_final.log" 2>&1
  echo "check_kernels rc=$?"; tail -2 "$OUT/check_kernels_split_slots_final.log"
  timeout 200 python3 -m pytest conformance -q --engine optimized -x > "$OUT/conformance_optimized_split_slots_final.log" 2>&1
  echo "conformance rc=$?"; tail -1 "$OUT/conformance_optimized_split_slots_final.log"
  timeout 60 python3 benches/gpu/probe_decode_cudnn.py --shapes 32x4096 --layouts shuffled --variants base \
    slow:TK_SPLIT_SLOWEST --splits 2 --split-sizes -64 --rounds 0 > "$OUT/probe_decode_split_slots_checks.log" 2>&1
  echo "probe checks rc=$?"; cat "$OUT/probe_decode_split_slots_checks.log"
  exit 0
fi
timeout 540 python3 benches/gpu/probe_decode_cudnn.py --shapes ${SHAPES:-32x4096 32x8192 32x16384} \
  --layouts shuffled inorder --variants base slow:TK_SPLIT_SLOWEST --split-sizes ${SIZES:--64 -128 -256 -512} \
  --rounds ${ROUNDS:-3} > "$OUT/probe_decode_split_slots$tag.log" 2>&1
echo "probe_decode_cudnn rc=$?"
grep -E "TB/s|DIFFER|differ|Error|error" "$OUT/probe_decode_split_slots$tag.log" | cut -c1-120
exit 0
