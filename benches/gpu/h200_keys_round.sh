#!/usr/bin/env bash
# Twelfth session's device calls (run from the repository root): bash benches/gpu/h200_keys_round.sh MODE
#   ab:     the split-KV decode kernel with keys as the MMAs' 16-row side (the tree) against the 16-query-row
#           kernel before it (benches/gpu/ab_variants/rows16_attention.cu, 06996ed's attention.cu, in c8f7a2e and removed
#           after the session: `git show 06996ed:optimized/kernels/attention.cu` recreates it): check_kernels'
#           decode sections on the tree, the A/B in one process (the bits differ: a new summation order), the
#           phase trace at batch 1, Nsight Compute on both kernels at 1 x 16k and 32 x 4k, and the tree's kernel
#           beside cuDNN at batch 32 and 128 (probe_stream.py). (The session's call ran this on a tree whose
#           decode launch left the shared-memory configuration to the driver: it picked the largest, for
#           three CTAs a multiprocessor, ~28 KB of L1, and the tree's kernel was 8-33% slower there.)
#   ab2:    the same A/B with the launch asking for two CTAs a multiprocessor (ops.DECODE_CTAS_PER_SM), Nsight
#           Compute's launch statistics, and probe_stream.py with two CTAs (the tree), with three (--carveout 100)
#           and with three and every copy bypassing L1 (-DTK_CP_ASYNC_CG --carveout 100)
#   checks: check_kernels (every section), the engine smoke test, then side by side: conformance at CI scale, the
#           GPU-scale qwen3-8b subset and the GPU-scale qwen3-0.6b clauses the decode kernel's bits reach (split-KV,
#           turns, sampling, batch invariance)
#   benches: the decode and prefill labs, the engine decode bench and the small-kernel lab
#   rest:   the GPU-scale qwen3-0.6b clauses of the checks call alone (there they ran out of time beside the
#           others after 13 passed), then the agentic workload
source benches/gpu/_env.sh
mode=${1:-ab}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
M="$NCU_METRICS,launch__registers_per_thread,launch__shared_mem_config_size,launch__occupancy_limit_shared_mem"
M+=",launch__occupancy_limit_registers,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed"
# ncu_keys PROBLEM LOG: $M of both kernels' launches (the base's first, then the tree's) on ab_attention.py's decode
# problem PROBLEM, into $OUT/LOG, and its metric lines
ncu_keys() {
  timeout 120 ncu --clock-control none -k "regex:split_kv_partials" --launch-count 2 --metrics "$M" \
    python3 benches/gpu/ab_attention.py --base benches/gpu/ab_variants/rows16_attention.cu --only decode --rounds 1 \
    --reps 1 --bits-may-differ --problems "$1" > "$OUT/$2" 2>&1
  echo "ncu problem $1 rc=$?"; grep -E "split_kv_partials|duration|inst_executed|issue_active|launch__|warps_active|dram__" \
    "$OUT/$2" | cut -c1-120 | head -40
}
if [ "$mode" = ab ]; then
  checks 200 check_kernels_keys.log splitkv fused invariant
  V=benches/gpu/ab_variants ab 240 rows16_attention.cu ab_attention_keys.log --only decode --rounds 3 --bits-may-differ
  timeout 90 python3 benches/gpu/trace_decode.py --problems 1:300 1:4096 8:4096 --reps 3 > "$OUT/trace_decode_keys.log" 2>&1
  echo "trace rc=$?"; grep -E "^==|span|prologue|first K|rest of|merge|ticket|fold" "$OUT/trace_decode_keys.log" | head -40
  ncu_keys 2 ncu_keys_p2.txt
  ncu_keys 7 ncu_keys_p7.txt
  timeout 150 python3 benches/gpu/probe_stream.py --batch 32 128 > "$OUT/probe_stream_keys.log" 2>&1
  echo "probe_stream rc=$?"; grep -E "TB/s|LAYOUTS|agree|us" "$OUT/probe_stream_keys.log" | head -24
fi
if [ "$mode" = ab2 ]; then
  V=benches/gpu/ab_variants ab 240 rows16_attention.cu ab_attention_keys2.log --only decode --rounds 3 --bits-may-differ
  timeout 90 python3 benches/gpu/trace_decode.py --problems 1:300 1:4096 8:4096 --reps 3 > "$OUT/trace_decode_keys2.log" 2>&1
  echo "trace rc=$?"; grep -E "span" "$OUT/trace_decode_keys2.log" | head -12
  ncu_keys 7 ncu_keys2_p7.txt
  for v in "" "--carveout 100" "--define TK_CP_ASYNC_CG --carveout 100"; do
    tag=$(echo "keys $v" | tr -d ' -')
    timeout 120 python3 benches/gpu/probe_stream.py --batch 32 128 $v > "$OUT/probe_stream_$tag.log" 2>&1
    echo "== probe_stream $v rc=$?"; grep -E "shuffled|cudnn" "$OUT/probe_stream_$tag.log"
  done
fi
if [ "$mode" = checks ]; then
  all_checks 200 check_kernels_keys_all.log
  smoke 100
  conformance_gpu 300 qwen3-8b conformance_gpu_qwen3-8b_keys.log > "$OUT/c8.summary" &
  conformance_gpu 300 "qwen3-0.6b and (splitk or invariant or turn or sample)" conformance_gpu_qwen3-0.6b_keys.log \
    > "$OUT/c06.summary" &
  conformance_ci 300
  wait
  cat "$OUT/c8.summary" "$OUT/c06.summary"; rm -f "$OUT/c8.summary" "$OUT/c06.summary"
fi
if [ "$mode" = benches ]; then
  run_benches 540 "kernel_prefill or kernel_decode or engine_decode or kernel_small"
  pack_bench
fi
if [ "$mode" = rest ]; then
  conformance_gpu 230 "qwen3-0.6b and (splitk or invariant or turn or sample)" conformance_gpu_qwen3-0.6b_keys.log
  run_benches 330 "agentic"
  pack_bench
fi
if [ "$mode" = invariant ]; then
  run_benches 330 "invariant_overhead"
  pack_bench
fi
