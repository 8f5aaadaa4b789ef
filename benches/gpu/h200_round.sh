#!/usr/bin/env bash
# One device call for a development round (logs under $OUT): kernel checks, engine smoke, the
# conformance suite at CI scale and the qwen3-0.6b INVARIANT / SPLITK clauses, run concurrently.
#   bash benches/gpu/h200_round.sh
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/env.txt"
build_kernels
( timeout 300 python3 benches/gpu/check_kernels.py > "$OUT/check_kernels.log" 2>&1; echo "check_kernels rc=$?";
  timeout 240 python3 benches/gpu/engine_smoke.py > "$OUT/engine_smoke.log" 2>&1; echo "engine_smoke rc=$?" ) &
( timeout 400 python3 -m pytest conformance -q -rs --engine optimized -p no:cacheprovider \
  --durations=10 > "$OUT/conformance_optimized.log" 2>&1; echo "conformance ci rc=$?" ) &
( timeout 400 python3 -m pytest conformance -q -rs --engine optimized -p no:cacheprovider \
  --conformance-scale gpu --oracle-device cuda -k "qwen3-0.6b and (invariant or splitk)" --durations=10 \
  > "$OUT/conformance_gpu_invariant.log" 2>&1; echo "conformance gpu invariant rc=$?" ) &
wait
grep -E "FAIL|passed, .* failed" "$OUT/check_kernels.log" | tail -30
grep -E "^\[(ok|FAIL)|FAILED" "$OUT/engine_smoke.log"
tail -3 "$OUT/conformance_optimized.log"; tail -3 "$OUT/conformance_gpu_invariant.log"
