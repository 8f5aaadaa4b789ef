#!/usr/bin/env bash
# One device call (logs under $OUT): does an L2 prefetch of a skinny GEMM's weights ahead of the
# latency-bound launches before it pay? probe_kernels --only prefetch (kernel chains), then
# profile_decode's A/B of the engine with the runner's prefetch switches, batch 1 and 8.
#   bash benches/gpu/h200_prefetch_round.sh
set -o pipefail
OUT="${OUT:-benches/results}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" CUPY_CACHE_DIR=/tmp/cupy_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 120 python3 benches/gpu/probe_kernels.py --only prefetch --reps 20 > "$OUT"/probe_prefetch.log 2>&1
echo "probe rc=$?"; cat "$OUT"/probe_prefetch.log
timeout 240 python3 benches/gpu/profile_decode.py --models qwen3-8b qwen3-0.6b --batches 1 8 --profile-batches \
  --variants w4 pf-o pf-o+gu16 --rounds 3 --out "$OUT" > "$OUT"/profile_prefetch.log 2>&1
echo "profile rc=$?"; grep -v "^     " "$OUT"/profile_prefetch.log | grep -v "Warn\|_warn" | tail -16
