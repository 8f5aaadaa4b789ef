#!/usr/bin/env bash
# One device call with the conformance suite on the optimized engine (logs under $OUT): the CI
# scale (tiny shapes), the GPU scale at the qwen3-0.6b shape, and the qwen3-8b subset (LOGIT,
# SPLITK, PAGED), run concurrently (the 8B subset peaks at 70-90 GB of the H200's 141).
#   bash benches/gpu/h200_conformance.sh
#   WITH_CHECKS=1 bash benches/gpu/h200_conformance.sh   # also check_kernels.py and engine_smoke.py
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/env.txt"
python3 -c "import torch, cupy, transformers; print('torch', torch.__version__, 'cupy', cupy.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" >> "$OUT/env.txt"
build_kernels
ARGS=(-q -rs -p no:cacheprovider --engine optimized --durations=12)
( timeout 300 python3 -m pytest conformance "${ARGS[@]}" > "$OUT/conformance_ci_optimized.log" 2>&1
  echo "conformance ci rc=$?"
  if [ -n "${WITH_CHECKS:-}" ]; then   # the kernel checks and the engine smoke test, after the CI-scale run
    timeout 240 python3 benches/gpu/check_kernels.py > "$OUT/check_kernels.log" 2>&1; echo "check_kernels rc=$?"
    timeout 120 python3 benches/gpu/engine_smoke.py > "$OUT/engine_smoke.log" 2>&1; echo "engine_smoke rc=$?"
  fi ) &
( timeout 560 python3 -m pytest conformance "${ARGS[@]}" --conformance-scale gpu --oracle-device cuda -k qwen3-0.6b \
  > "$OUT/conformance_gpu_qwen3-0.6b.log" 2>&1; echo "conformance qwen3-0.6b rc=$?" ) &
( timeout 440 python3 -m pytest conformance "${ARGS[@]}" --conformance-scale gpu --oracle-device cuda -k qwen3-8b \
  > "$OUT/conformance_gpu_qwen3-8b.log" 2>&1; echo "conformance qwen3-8b rc=$?" ) &
wait
for f in conformance_ci_optimized conformance_gpu_qwen3-0.6b conformance_gpu_qwen3-8b; do
  echo "== $f"; grep -E "CONFORMANCE FAILURE|^FAILED" "$OUT/$f.log" | head -8; tail -2 "$OUT/$f.log"
done
if [ -n "${WITH_CHECKS:-}" ]; then
  grep -E "FAIL|passed, .* failed" "$OUT/check_kernels.log" | tail -10; grep -E "^\[(ok|FAIL)|FAILED" "$OUT/engine_smoke.log"
fi
