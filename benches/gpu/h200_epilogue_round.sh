#!/usr/bin/env bash
# The sixth session's decode-GEMM rounds on the H200 (logs under $OUT).
#   bash benches/gpu/h200_epilogue_round.sh checks   # every kernel check and the engine smoke test; the
#       skinny GEMMs alone and with their layer's next launch (probe_kernels --only epilogue) and over
#       4 / 8 / 16 warps per CTA (--only warps); profile_decode's alternating A/B of last session's
#       defaults (pdl+auto), + the SwiGLU epilogue (fused), + 4-warp CTAs for many-tile GEMMs (w4) at
#       batch 1, 8 and 32 of both model shapes, with the graph timeline at batch 1
#   bash benches/gpu/h200_epilogue_round.sh record   # engine_decode (reports packed into $OUT/bench.tgz)
#       and the conformance suite at CI scale on the optimized engine
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
build_kernels
if [ "${1:-checks}" = record ]; then
  run_benches 300 "engine_decode"
  grep -E "turnkv|: x transformers|% of the memory roofline" "$OUT/bench/engine_decode.md" | head -30
  pack_bench
  timeout 200 python3 -m pytest conformance -q -rs -p no:cacheprovider --engine optimized --durations=5 \
    > "$OUT"/conformance_ci_optimized.log 2>&1
  echo "conformance ci rc=$?"; grep -E "CONFORMANCE FAILURE|^FAILED" "$OUT"/conformance_ci_optimized.log | head -8
  tail -1 "$OUT"/conformance_ci_optimized.log
  exit 0
fi
timeout 200 python3 benches/gpu/check_kernels.py > "$OUT"/check_kernels.log 2>&1; echo "check_kernels rc=$?"
grep -E "FAIL" "$OUT"/check_kernels.log | head -20; tail -1 "$OUT"/check_kernels.log
timeout 100 python3 benches/gpu/engine_smoke.py > "$OUT"/engine_smoke.log 2>&1; echo "engine_smoke rc=$?"
grep -E "^\[(ok|FAIL)|FAILED|Error" "$OUT"/engine_smoke.log | head
timeout 150 python3 benches/gpu/probe_kernels.py --only epilogue warps --reps 20 > "$OUT"/probe_skinny.log 2>&1
echo "probe rc=$?"; grep -E "pick|fused" "$OUT"/probe_skinny.log
timeout ${PROFILE_S:-260} python3 benches/gpu/profile_decode.py --models qwen3-8b qwen3-0.6b --batches 1 8 32 \
  --profile-batches --timeline-batches 1 --variants pdl+auto fused w4 --rounds 3 --out "$OUT" > "$OUT"/profile_decode.log 2>&1
echo "profile rc=$?"
grep -v "^     " "$OUT"/profile_decode.log | grep -v "Warn\|_warn" | tail -24
