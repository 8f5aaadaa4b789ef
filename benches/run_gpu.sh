#!/usr/bin/env bash
# The one script to run on the H200: prints the environment, then runs every bench at the GPU
# scale. Reports (JSON + markdown + PNG per bench group, summary.json, latest.md) and the log go
# to $OUT/bench when OUT is set (the device machine's output folder), else to benches/results.
#   bash benches/run_gpu.sh                      # from the repository root
#   bash benches/run_gpu.sh -k "kernel_decode"   # extra arguments go to pytest
#   bash benches/run_gpu.sh -k "invariant_overhead or kernel_gemm"   # the batch-invariant mode and its GEMM only
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
if [ -n "${OUT:-}" ]; then DEST="$OUT/bench"; else DEST="benches/results"; fi
mkdir -p "$DEST"
LOG="$DEST/run_gpu.log"
{
  echo "== turnkv benches, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi || echo "nvidia-smi: not available"
  "$PY" - <<'PYEOF'
import importlib, platform, sys
print("python", platform.python_version(), sys.executable)
for m in ("torch", "cupy", "transformers", "pytest", "pytest_benchmark", "matplotlib", "numpy"):
    try:
        print(f"{m:18s}", getattr(importlib.import_module(m), "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(f"{m:18s} MISSING ({type(e).__name__}: {e})")
try:
    import torch
    print("cuda", torch.version.cuda, "| device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
          "| cudnn", torch.backends.cudnn.version())
except Exception as e:  # noqa: BLE001
    print("torch CUDA query failed:", e)
PYEOF
  if ! "$PY" -c "import torch, cupy; assert torch.cuda.is_available()" 2>/dev/null; then
    echo "run_gpu.sh: needs a CUDA GPU visible to torch and CuPy; refusing to report skipped benches as a run" >&2
    exit 2
  fi
  echo "== pytest benches --bench-scale gpu --bench-out $DEST"
  PYTHONUNBUFFERED=1 PYTHONPATH=. "$PY" -m pytest benches -q -p no:cacheprovider --bench-scale gpu \
    --bench-out "$DEST" --benchmark-columns=median,iqr,rounds --benchmark-sort=name "$@"
} 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
