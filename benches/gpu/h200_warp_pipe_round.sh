#!/usr/bin/env bash
# Twenty-sixth session's device calls: the split-KV decode's key loop with one pipeline a warp (each warp waits
# for its own rows of a tile and refills them with tile j + 2 as soon as it has read them, no barrier across the
# CTA) against the CTA-wide loop before it (docs/performance/decode_attention.md, "Decode attention"; run from the repository root):
#   bash benches/gpu/h200_warp_pipe_round.sh MODE
#   ab:   check_kernels.py on the decode sections (splitkv, fused, qk, fused_rope, invariant), ab_attention.py
#         against benches/gpu/ab_variants/cta_pipe_attention.cu (the tree's attention.cu before the change: bits
#         must be equal), then probe_decode_cudnn.py at the shapes where the kernel trailed cuDNN (and 33 x 4096,
#         8 x 4096, 1 x 16384) over shuffled and in-order pages
#   verify: on the tree after the change was dropped: every check_kernels.py section, the engine smoke test and
#         conformance at CI scale
#   peer: Nsight Compute on one launch each of ours (shuffled and in-order pages) and of cuDNN at 32 x 4096,
#         33 x 4096 and 128 x 1024 (benches/gpu/profile_decode_peer.py): grid, occupancy, DRAM bytes and throughput,
#         and the multiprocessors' active cycles (min / avg / max: how evenly the work fell on them)
#   warm: the same launches with --cache-control none (each metric pass finds the L2 as the pass before it, the same
#         kernel, left it: as in back-to-back calls): DRAM bytes read, L2 read hit rate and duration
#   stalls: at 32 x 4096 only, the warps' states, the schedulers and the memory tables of the same launches
#   reasons: at 32 x 4096 only, the warps' stall reasons (cycles per issued instruction, by reason) of the same launches
#   frag: the key loop's K and V fragments loaded ahead of their MMAs (all of a tile's K fragments before the
#         scores' MMAs, the V fragments before the online softmax): the decode sections of check_kernels.py, then
#         ab_attention.py against benches/gpu/ab_variants/frag_order_base_attention.cu (the tree before; bits equal)
#   TAG: the files' suffix (default _MODE)
# The ab mode needs the tree of commit 459d410 (the per-warp loop and the base file beside it); the change was
# dropped after it (slower at every shape). The frag mode needs the tree of 73c074e, for the same reason (no gain).
# The peer, warm, stalls and reasons modes ran on d11fc0f's kernels, which are today's.
source benches/gpu/_env.sh
mode=${1:-ab}
tag=${TAG:-_$mode}
if [ "$mode" = ab ] && [ ! -f benches/gpu/ab_variants/cta_pipe_attention.cu ]; then
  echo "mode ab needs the tree of 459d410"; exit 1
fi
if [ "$mode" = frag ] && [ ! -f benches/gpu/ab_variants/frag_order_base_attention.cu ]; then
  echo "mode frag needs the tree of 73c074e"; exit 1
fi
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
if [ "$mode" = ab ]; then
  checks 200 check_kernels_decode_warp_pipe.log splitkv fused qk fused_rope invariant
  ab 170 cta_pipe_attention.cu ab_warp_pipe.log --only decode --rounds 3
  probe_trailing 200 probe_decode_cudnn_warp_pipe.log
fi
# ncu_peer GREP PROBE_ARGS NCU_ARGS...: Nsight Compute (clocks as they are) on profile_decode_peer.py's three NVTX
# ranges (PROBE_ARGS: its arguments, word-split) into $OUT/ncu_decode_peer$tag.txt, and the lines matching GREP
ncu_peer() {
  local pat=$1 args=$2; shift 2
  # shellcheck disable=SC2086
  timeout 400 ncu --clock-control none --nvtx --nvtx-include "ours_shuffled/" --nvtx-include "ours_inorder/" \
    --nvtx-include "cudnn/" "$@" python3 benches/gpu/profile_decode_peer.py $args > "$OUT/ncu_decode_peer$tag.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "^  [a-zA-Z_0-9]+.*\(|B=|$pat" "$OUT/ncu_decode_peer$tag.txt" | cut -c1-150 | head -150
}
if [ "$mode" = peer ]; then
  ncu_peer "Duration|Grid Size|Block Size|Registers Per|Waves Per|Block Limit (Registers|Shared)|Achieved Occ|Memory Throughput|DRAM Through|sm__cycles_active|dram__bytes_read|Dynamic Shared" "" \
    --section LaunchStats --section Occupancy --section SpeedOfLight \
    --metrics sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,dram__bytes_read.sum
fi
if [ "$mode" = warm ]; then
  ncu_peer "gpu__time|dram__bytes|lts__t" "" --cache-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_op_read_hit_rate.pct,lts__t_sectors_op_read.sum
fi
if [ "$mode" = stalls ]; then
  ncu_peer "inst_executed|issue_active|Warp Cycles Per Issued|No Eligible|Active Warps Per|Eligible Warps|Stall|stall" \
    "--shapes 32x4096" --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis_Tables \
    --section SourceCounters --metrics smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
fi
if [ "$mode" = reasons ]; then
  m=gpu__time_duration.sum,smsp__inst_executed.sum
  for st in barrier branch_resolving dispatch_stall drain imc_miss lg_throttle long_scoreboard math_pipe_throttle \
    membar mio_throttle misc no_instruction not_selected selected short_scoreboard sleeping tex_throttle wait; do
    m+=",smsp__average_warps_issue_stalled_${st}_per_issue_active.ratio"
  done
  ncu_peer "gpu__time|inst_executed|stalled" "--shapes 32x4096" --metrics "$m"
fi
if [ "$mode" = frag ]; then
  checks 200 check_kernels_decode_frag_order.log splitkv fused qk fused_rope invariant
  ab 170 frag_order_base_attention.cu ab_frag_order.log --only decode --rounds 3
fi
if [ "$mode" = verify ]; then
  all_checks 300 check_kernels$tag.log
  smoke 120   # engine_smoke.log, kept as engine_smoke_verify.log
  conformance_ci 150   # conformance_ci_optimized.log, kept as conformance_ci_optimized_verify.log
fi
