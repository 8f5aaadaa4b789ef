#!/usr/bin/env bash
# One device call (logs under $OUT): the skinny GEMM checks, probe_kernels' warps-per-CTA sweep of the
# skinny GEMMs at the qwen3-8b shapes, and Nsight Compute on the first down_proj and gate/up launches.
#   bash benches/gpu/h200_warps_round.sh
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 python3 benches/gpu/check_kernels.py --only skinny epilogue > "$OUT"/check_skinny.log 2>&1; echo "check rc=$?"
grep -E "FAIL" "$OUT"/check_skinny.log | head -20; tail -1 "$OUT"/check_skinny.log
timeout 200 python3 benches/gpu/probe_kernels.py --only warps --reps 20 > "$OUT"/probe_warps.log 2>&1
echo "probe rc=$?"; cat "$OUT"/probe_warps.log
for k in skinny_m8_w8_bf16 skinny_swiglu_m8_w8; do
  timeout 120 ncu --clock-control none -k "regex:^$k\$" --launch-count 1 --kill yes --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats \
    python3 benches/gpu/probe_kernels.py --only warps --reps 2 > "$OUT"/ncu_$k.txt 2>&1
  echo "ncu $k rc=$?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Waves Per SM|Stall|Warp Cycles Per Issued|Block Limit" "$OUT"/ncu_$k.txt | head -24
done
