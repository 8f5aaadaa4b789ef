#!/usr/bin/env bash
# Eleventh session's device calls (run from the repository root): bash benches/gpu/h200_stream_round.sh MODE
#   probe: the read stream of decode attention at large batch through different layouts
#          (probe_stream.py), then Nsight Compute's DRAM counters of each layout's launch at batch 32
#   ca:    the tree's copies against every copy by .cg (-DTK_CP_ASYNC_CG) in one process: attention
#          (ab_attention.py) and the batch-invariant GEMM (ab_gemm.py), bits and times; the probe again; the
#          prefill and decode labs; check_kernels on the sections that use cp.async (the session's call ran
#          it on a tree whose every copy was .ca; the tree now picks .ca per kernel from that call's data)
#   final: the same A/Bs, then the kernel labs and the engine decode bench
#   benches: the agentic workload, the GEMM lab and the batch-invariant overhead bench
#   conf06: the GPU-scale qwen3-0.6b conformance clauses outside the tenth session's subset
#   skinny: the skinny GEMM's weight loads, L1 no-allocate against the TK_SKINNY_LD variants (A/B, Nsight Compute)
#   checks: check_kernels (every section), the engine smoke test, conformance at CI scale and the GPU-scale
#          qwen3-8b subset
#   l1:    the same probe with the decode kernel's shared-memory carveout preferences, and with every copy
#          bypassing L1 (.cg, -DTK_CP_ASYNC_CG); Nsight Compute's L2 -> L1 traffic and launch statistics of each
#          (the session's call ran it the other way round: .cg the default, -DTK_CP_ASYNC_CA the variant)
source benches/gpu/_env.sh
mode=${1:-probe}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
# Nsight Compute metrics of the probes: time, DRAM and L2 -> SM traffic, L2 hit rate
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
M+=,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_op_read_hit_rate.pct,l1tex__m_xbar2l1tex_read_bytes.sum
if [ "$mode" = probe ]; then
  timeout 240 python3 benches/gpu/probe_stream.py --batch 32 128 > "$OUT/probe_stream.log" 2>&1
  echo "probe_stream rc=$?"; cat "$OUT/probe_stream.log" | tail -22
  timeout 150 ncu --clock-control none -k "regex:split_kv|cudnn|sdpa|fmha|flash" --launch-count 8 \
    --metrics "$M,lts__average_gcomp_input_sector_success_rate.pct,smsp__warps_active.avg.per_cycle_active" \
    python3 benches/gpu/probe_stream.py --batch 32 --rounds 0 > "$OUT/ncu_stream.txt" 2>&1
  echo "ncu rc=$?"; grep -E "^  [a-zA-Z_].*\(|duration|dram__|lts__|l1tex__|warps_active" "$OUT/ncu_stream.txt" | cut -c1-160 | head -60
fi
M+=,launch__shared_mem_config_size,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers
if [ "$mode" = l1 ]; then
  for v in "--carveout 100" "--carveout 72" "--carveout 0" "--define TK_CP_ASYNC_CG" "--define TK_CP_ASYNC_CG --carveout 72"; do
    tag=$(echo "$v" | tr -d ' -' )
    timeout 120 python3 benches/gpu/probe_stream.py --batch 32 128 $v > "$OUT/probe_stream_$tag.log" 2>&1
    echo "== $v rc=$?"; grep -E "carveout|built with|ours NHD shuffled  |cudnn BHSD  |LAYOUTS" "$OUT/probe_stream_$tag.log"
    timeout 90 ncu --clock-control none -k "regex:split_kv" --launch-count 1 --metrics "$M" \
      python3 benches/gpu/probe_stream.py --batch 32 --rounds 0 $v > "$OUT/ncu_stream_$tag.txt" 2>&1
    echo "ncu rc=$?"; grep -E "duration|dram__|lts__|l1tex__|launch__" "$OUT/ncu_stream_$tag.txt" | cut -c1-120
  done
fi

if [ "$mode" = ca ]; then
  V=optimized/kernels ab 240 attention.cu ab_attention_ca.log --base-define TK_CP_ASYNC_CG --rounds 3
  timeout 150 python3 benches/gpu/ab_gemm.py --base-define TK_CP_ASYNC_CG > "$OUT/ab_gemm_ca.log" 2>&1
  echo "ab_gemm rc=$?"; grep -E "new/base|bitwise|DIFFER" "$OUT/ab_gemm_ca.log" | cut -c1-220
  timeout 120 python3 benches/gpu/probe_stream.py --batch 32 128 > "$OUT/probe_stream_ca.log" 2>&1
  echo "probe_stream rc=$?"; grep -E "TB/s|LAYOUTS|agree" "$OUT/probe_stream_ca.log"
  run_benches 240 "kernel_prefill or kernel_decode"
  pack_bench
  checks 150 check_kernels_ca.log prefill splitkv fused gemm invariant
fi

if [ "$mode" = final ]; then
  V=optimized/kernels ab 200 attention.cu ab_attention_final.log --base-define TK_CP_ASYNC_CG --rounds 3
  timeout 120 python3 benches/gpu/ab_gemm.py --base-define TK_CP_ASYNC_CG > "$OUT/ab_gemm_final.log" 2>&1
  echo "ab_gemm rc=$?"; grep -E "new/base|bitwise|DIFFER" "$OUT/ab_gemm_final.log" | cut -c1-200
  run_benches 420 "kernel_prefill or kernel_decode or engine_decode"
  pack_bench
fi
if [ "$mode" = checks ]; then
  all_checks 240 check_kernels_final.log
  smoke 120
  conformance_gpu 240 qwen3-8b conformance_gpu_qwen3-8b.log > "$OUT/conformance_gpu_qwen3-8b.summary" &
  conformance_ci 240
  wait
  cat "$OUT/conformance_gpu_qwen3-8b.summary"; rm -f "$OUT/conformance_gpu_qwen3-8b.summary"
fi
if [ "$mode" = benches ]; then   # the benches the tree's copies change end to end: agentic, GEMM lab, batch-invariant overhead
  run_benches 560 "agentic or kernel_gemm or invariant_overhead"
  pack_bench
fi
if [ "$mode" = conf06 ]; then   # the GPU-scale qwen3-0.6b clauses the tenth session's subset did not run
  conformance_gpu 450 "qwen3-0.6b and not (splitk or invariant or turn)" conformance_gpu_qwen3-0.6b_rest.log
fi
if [ "$mode" = skinny ]; then   # the skinny GEMM's weight loads: L1 no-allocate (the tree) against allocating / no L2 hint
  for v in 1 2 3; do
    timeout 100 python3 benches/gpu/ab_gemm.py --module skinny_gemm --new-define TK_SKINNY_LD=$v > "$OUT/ab_skinny_ld$v.log" 2>&1
    echo "ab skinny TK_SKINNY_LD=$v rc=$?"; grep -E "new/base|bitwise|DIFFER" "$OUT/ab_skinny_ld$v.log" | cut -c1-230
  done
  timeout 90 ncu --clock-control none -k "regex:skinny" --launch-count 2 --metrics "$M" python3 benches/gpu/ab_gemm.py \
    --module skinny_gemm --new-define TK_SKINNY_LD=1 --shapes gate_up --rows 1 --rounds 0 > "$OUT/ncu_skinny_ld1.txt" 2>&1
  echo "ncu rc=$?"; grep -E "skinny_|duration|dram__|lts__|l1tex__" "$OUT/ncu_skinny_ld1.txt" | cut -c1-120
fi
