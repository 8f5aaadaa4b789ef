#!/usr/bin/env bash
# Twenty-first session's device calls: why the cluster kernel (skinny_cluster_*, 17-64 rows) streams its weights
# at a fifth of cuBLAS's rate (docs/performance.md, "Decode GEMMs on cuBLAS"; run from the repository root):
#   bash benches/gpu/h200_cluster_round.sh MODE
#   trace:  check_kernels.py --only cluster (bits), then trace_cluster.py at 32 and 64 rows for the qwen3-0.6b and
#           qwen3-8b GEMMs: the driver's cluster capacity and the grid, each build's time (default, local-x,
#           local), one traced launch's per-CTA and per-stage timeline
source benches/gpu/_env.sh
mode=${1:-trace}
shift
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
if [ "$mode" = trace ]; then
  timeout 100 python3 benches/gpu/check_kernels.py --only cluster > "$OUT/check_kernels_cluster_trace.log" 2>&1
  echo "check_kernels cluster rc=$?"; grep -E "FAIL" "$OUT/check_kernels_cluster_trace.log" | head -10
  tail -2 "$OUT/check_kernels_cluster_trace.log"
  for m in qwen3-0.6b qwen3-8b; do
    timeout 150 python3 benches/gpu/trace_cluster.py --model $m --ms 32 64 --out "$OUT" > "$OUT/trace_cluster_$m.log" 2>&1
    echo "trace_cluster $m rc=$?"; cut -c1-400 "$OUT/trace_cluster_$m.log"
  done
fi
