#!/usr/bin/env bash
# One device call: the engine smoke check, then the conformance suite on the optimized engine.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" CUPY_CACHE_DIR=/tmp/cupy_cache
OUT="${OUT:-benches/results}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, cupy, transformers; print('torch', torch.__version__, 'cupy', cupy.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" | tee -a "$OUT/env.txt"
timeout 200 python3 benches/gpu/engine_smoke.py 2>&1 | tee "$OUT/engine_smoke.log"
timeout "${CONF_TIMEOUT:-240}" python3 -m pytest conformance -q --maxfail=40 --engine optimized -p no:cacheprovider ${CONF_ARGS:-} 2>&1 | tee "$OUT/conformance_optimized.log"
