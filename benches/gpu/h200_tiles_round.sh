#!/usr/bin/env bash
# One device call: the skinny GEMM checks (the tile loop among them), then probe_kernels' CTA-count
# sweep of the skinny GEMMs at the qwen3-8b shapes (logs under $OUT).
#   bash benches/gpu/h200_tiles_round.sh
set -o pipefail
OUT="${OUT:-benches/results}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" CUPY_CACHE_DIR=/tmp/cupy_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 python3 benches/gpu/check_kernels.py --only skinny epilogue > "$OUT"/check_skinny.log 2>&1; echo "check rc=$?"
grep -E "FAIL" "$OUT"/check_skinny.log | head -20; tail -1 "$OUT"/check_skinny.log
timeout 300 python3 benches/gpu/probe_kernels.py --only tiles --reps 20 > "$OUT"/probe_tiles.log 2>&1
echo "probe rc=$?"; cat "$OUT"/probe_tiles.log
