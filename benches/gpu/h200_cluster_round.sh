#!/usr/bin/env bash
# Twenty-first session's device calls: why the cluster kernel (skinny_cluster_*, 17-64 rows) streams its weights
# at a fifth of cuBLAS's rate (docs/performance/gemm.md, "Decode GEMMs on cuBLAS"; run from the repository root):
#   bash benches/gpu/h200_cluster_round.sh MODE
#   trace:  check_kernels.py --only cluster (bits), then trace_cluster.py at 32 and 64 rows for the qwen3-0.6b and
#           qwen3-8b GEMMs: the driver's cluster capacity and the grid, each build's time (default, local-x,
#           local), one traced launch's per-CTA and per-stage timeline (the kernel of 7e85075: a copy a row)
#   tma:    the same with the kernel's copies as tensor copies (a box a copy), then the engine A/B (profile_decode.py:
#           default against the cl-* variants) at qwen3-0.6b batch 32 and 64 (timelines at 64), batch 64 after 1664
#           tokens, and qwen3-8b batch 32 and 64
#   final:  the engine A/B at qwen3-0.6b batch 32 and 64 (default, cl-k512, cl-mix), the engine smoke test and
#           conformance at CI scale on the optimized engine (the launch path's new argument packing)
#   w8:     check_kernels.py --only cluster and trace_cluster.py (both models) with the eight-warp builds
#   ncu:    check_kernels.py --only cluster, trace_cluster.py (qwen3-8b), then Nsight Compute on qwen3-8b's gate/up at 32
#           rows (torch's matmul and the cluster kernel at 256 and 512 columns a chunk; run_cluster_once.py)
source benches/gpu/_env.sh
mode=${1:-trace}
shift
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
tag=""; { [ "$mode" = tma ] || [ "$mode" = ncu ] || [ "$mode" = w8 ]; } && tag=${TAG:-_tma}   # TAG: the files' suffix of a later tma call
if [ "$mode" = trace ] || [ "$mode" = tma ] || [ "$mode" = ncu ] || [ "$mode" = w8 ]; then
  timeout 160 python3 benches/gpu/check_kernels.py --only cluster > "$OUT/check_kernels_cluster_trace$tag.log" 2>&1
  rc=$?; echo "check_kernels cluster rc=$rc"; grep -E "FAIL" "$OUT/check_kernels_cluster_trace$tag.log" | head -10
  tail -2 "$OUT/check_kernels_cluster_trace$tag.log"
  [ $rc -ne 0 ] && exit 1   # (a hang or a wrong bit: nothing after it is worth the device time)
  models="qwen3-0.6b qwen3-8b"; [ "$mode" = ncu ] && models=qwen3-8b
  for m in $models; do
    timeout 150 python3 benches/gpu/trace_cluster.py --model $m --ms 32 64 --out "$OUT" --tag "$tag" \
      > "$OUT/trace_cluster${tag}_$m.log" 2>&1
    echo "trace_cluster $m rc=$?"; cut -c1-400 "$OUT/trace_cluster${tag}_$m.log"
  done
fi
if [ "$mode" = tma ]; then
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 32 64 --profile-batches \
    --timeline-batches 64 --rounds 3 --variants default cl-s4 cl-s3 cl-t1 > "$OUT/profile${tag}_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+(32|64) +" "$OUT/profile${tag}_06b.log"
  grep -E "graph timeline|^\s+[0-9]+x" "$OUT/profile${tag}_06b.log" | cut -c1-120 | head -60
  timeout 100 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 64 --prompt 1664 --profile-batches \
    --rounds 3 --variants default cl-s4 cl-head > "$OUT/profile${tag}_06b_1664.log" 2>&1
  echo "profile 0.6b 1664 rc=$?"; grep -E "^\s+64 +" "$OUT/profile${tag}_06b_1664.log"
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 32 64 --profile-batches \
    --rounds 3 --variants default cl-s4 cl-lim > "$OUT/profile${tag}_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -E "^\s+(32|64) +" "$OUT/profile${tag}_8b.log"
fi
if [ "$mode" = ncu ]; then
  M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_bytes.sum"
  M+=",sm__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active"
  M+=",l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
  M+=",smsp__inst_executed.sum,smsp__inst_executed_pipe_tensor_op_hmma.sum,smsp__issue_active.avg.pct_of_peak_sustained_active"
  M+=",sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__warps_active.avg.per_cycle_active"
  for st in long_scoreboard short_scoreboard wait barrier membar sleeping mio_throttle math_pipe_throttle lg_throttle \
            no_instruction dispatch_stall branch_resolving selected misc; do
    M+=",smsp__average_warps_issue_stalled_${st}_per_issue_active.ratio"
  done
  timeout 200 ncu --clock-control none -k "regex:skinny_cluster|nvjet" --launch-count 6 --metrics "$M" \
    python3 benches/gpu/run_cluster_once.py --configs 256:3:2:4 512:2:2:4 > "$OUT/ncu_cluster${tag}.txt" 2>&1
  echo "ncu rc=$?"; grep -vE "^==PROF==|^\s*$" "$OUT/ncu_cluster${tag}.txt" | cut -c1-150 | tail -80
fi
if [ "$mode" = final ]; then
  timeout 100 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 32 64 --rounds 3 \
    --variants default cl-k512 cl-mix > "$OUT/profile_final_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+(32|64) +" "$OUT/profile_final_06b.log"
  smoke 150; mv "$OUT/engine_smoke.log" "$OUT/engine_smoke_cluster_final.log"
  conformance_ci 240; mv "$OUT/conformance_ci_optimized.log" "$OUT/conformance_ci_optimized_cluster_final.log"
fi
