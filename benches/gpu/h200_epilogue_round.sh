#!/usr/bin/env bash
# One device call for the SwiGLU-epilogue round (logs under $OUT): every kernel check (the "epilogue"
# section among them) and the engine smoke test; the kernel-level A/B of the skinny GEMMs with and
# without their layer's next launch (probe_kernels.py --only epilogue); profile_decode's A/B of the
# epilogue (pdl+auto: off; fused: on) at batch 1, 8 and 32 of both model shapes, with the graph
# timeline at batch 1; then the conformance suite at CI scale on the optimized engine.
#   bash benches/gpu/h200_epilogue_round.sh
set -o pipefail
OUT="${OUT:-benches/results}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" CUPY_CACHE_DIR=/tmp/cupy_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import optimized.kernels as k; k.load_all(); print('kernels built')" 2>&1 | tail -3
timeout 200 python3 benches/gpu/check_kernels.py > "$OUT"/check_kernels.log 2>&1; echo "check_kernels rc=$?"
grep -E "FAIL" "$OUT"/check_kernels.log | head -20; tail -1 "$OUT"/check_kernels.log
timeout 100 python3 benches/gpu/engine_smoke.py > "$OUT"/engine_smoke.log 2>&1; echo "engine_smoke rc=$?"
grep -E "^\[(ok|FAIL)|FAILED|Error" "$OUT"/engine_smoke.log | head
timeout 100 python3 benches/gpu/probe_kernels.py --only epilogue --reps 20 > "$OUT"/probe_epilogue.log 2>&1
echo "probe rc=$?"; cat "$OUT"/probe_epilogue.log
timeout ${PROFILE_S:-200} python3 benches/gpu/profile_decode.py --models qwen3-8b qwen3-0.6b --batches 1 8 32 \
  --profile-batches --timeline-batches 1 --variants pdl+auto fused --rounds 3 --out "$OUT" > "$OUT"/profile_decode.log 2>&1
echo "profile rc=$?"
grep -v "^     " "$OUT"/profile_decode.log | grep -v "Warn\|_warn" | tail -24
timeout ${CONF_S:-200} python3 -m pytest conformance -q -rs -p no:cacheprovider --engine optimized --durations=5 \
  > "$OUT"/conformance_ci_optimized.log 2>&1
echo "conformance ci rc=$?"; grep -E "CONFORMANCE FAILURE|^FAILED" "$OUT"/conformance_ci_optimized.log | head -8
tail -1 "$OUT"/conformance_ci_optimized.log
