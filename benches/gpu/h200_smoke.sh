#!/usr/bin/env bash
# One device call that checks the optimized engine end to end on an H200 (logs under $OUT):
# kernel checks, the engine smoke check against the reference, the conformance suite at CI scale
# (shapes the kernels are not built for are skipped with the reason), then at GPU scale (qwen3-0.6b).
#   bash benches/gpu/h200_smoke.sh            # CONF_TIMEOUT / GPU_CONF_TIMEOUT bound the two suites
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" CUPY_CACHE_DIR=/tmp/cupy_cache
OUT="${OUT:-benches/results}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, cupy, transformers; print('torch', torch.__version__, 'cupy', cupy.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" | tee -a "$OUT/env.txt"
timeout 240 python3 benches/gpu/check_kernels.py 2>&1 | tail -60 > "$OUT/check_kernels.log"; echo "check_kernels rc=$?"
timeout 200 python3 benches/gpu/engine_smoke.py 2>&1 | tee "$OUT/engine_smoke.log"
timeout "${CONF_TIMEOUT:-240}" python3 -m pytest conformance -q -rs --engine optimized -p no:cacheprovider \
  2>&1 | tee "$OUT/conformance_optimized.log" | tail -5
timeout "${GPU_CONF_TIMEOUT:-400}" python3 -m pytest conformance -q -rs --engine optimized -p no:cacheprovider \
  --conformance-scale gpu --oracle-device cuda -k qwen3 2>&1 | tee "$OUT/conformance_optimized_gpu_scale.log" | tail -5
