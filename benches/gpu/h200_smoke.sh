#!/usr/bin/env bash
# One device call that checks the optimized engine end to end on an H200 (logs under $OUT):
# kernel checks, the engine smoke check against the reference, the conformance suite at CI scale
# (shapes the kernels are not built for are skipped with the reason), then at GPU scale (qwen3-0.6b).
# The three jobs run concurrently on the one GPU (they are small); each is bounded by its own timeout.
#   bash benches/gpu/h200_smoke.sh    # CHECK_TIMEOUT / CONF_TIMEOUT / GPU_CONF_TIMEOUT bound the jobs
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" CUPY_CACHE_DIR=/tmp/cupy_cache
OUT="${OUT:-benches/results}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, cupy, transformers; print('torch', torch.__version__, 'cupy', cupy.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" | tee -a "$OUT/env.txt"
# warm the kernel cache once so the concurrent jobs do not all compile
python3 -c "import optimized.kernels as k; k.load_all()" 2>&1 | tail -3
( timeout "${CHECK_TIMEOUT:-240}" python3 benches/gpu/check_kernels.py > "$OUT/check_kernels.log" 2>&1; echo "check_kernels rc=$?";
  timeout 200 python3 benches/gpu/engine_smoke.py > "$OUT/engine_smoke.log" 2>&1; echo "engine_smoke rc=$?" ) &
( timeout "${CONF_TIMEOUT:-400}" python3 -m pytest conformance -q -rs --engine optimized -p no:cacheprovider \
  --durations=15 > "$OUT/conformance_optimized.log" 2>&1; echo "conformance ci rc=$?" ) &
( timeout "${GPU_CONF_TIMEOUT:-500}" python3 -m pytest conformance -q -rs --engine optimized -p no:cacheprovider \
  --conformance-scale gpu --oracle-device cuda -k qwen3-0.6b --durations=15 \
  > "$OUT/conformance_optimized_gpu_scale.log" 2>&1; echo "conformance gpu-scale rc=$?" ) &
wait
tail -4 "$OUT/check_kernels.log"; grep -E "^\[(ok|FAIL)" "$OUT/engine_smoke.log"
tail -3 "$OUT/conformance_optimized.log"; tail -3 "$OUT/conformance_optimized_gpu_scale.log"
