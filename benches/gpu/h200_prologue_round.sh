#!/usr/bin/env bash
# The tenth session's rounds on the H200 (logs under $OUT): the decode kernel's prologue (length, pages and
# Q loaded together), the row tables' 32-bit 16-byte-chunk offsets, the page of the row table two tiles
# ahead read at the top of an iteration, the fused reduce's ticket and loads, the phase trace of a decode
# launch, and the split reduce as one maximum, in-order sums and one division.
# benches/gpu/ab_variants/ab_base9_attention.cu was `git show fcaf3a2:optimized/kernels/attention.cu` (the
# ninth session's kernels, the base of every A/B) and ab_ticket_attention.cu `git show
# 9ae6f44:optimized/kernels/attention.cu`; both are in commit de8cb48 and were removed after it.
#   bash benches/gpu/h200_prologue_round.sh ab     # the attention checks (prefill, split-KV, fused decode, fused
#       RoPE, batch-invariant attention), ab_attention.py against the base (bits and time, prefill and decode
#       lab problems), Nsight Compute counts of split_kv_partials_d128 at 1 x 4096 and 8 x 4096 (base, then tree)
#   bash benches/gpu/h200_prologue_round.sh ticket # (the fused reduce's ticket taken by one acquire-release
#       atomic instead of a fence in every thread) every kernel check, the same A/B and counts, the engine
#       smoke test
#   bash benches/gpu/h200_prologue_round.sh fold   # (the fold loads only its live splits; Q's fragments read after
#       the first tile's wait, one barrier less) the split-KV checks, ab_attention.py decode problems against
#       ab_ticket_attention.cu (the tree of the `ticket` and `final` calls) and against the base
#   bash benches/gpu/h200_prologue_round.sh trace  # trace_decode.py: where a decode launch's time goes, per phase
#       of its CTAs (the kept kernels, compiled with their phase stamps)
#   bash benches/gpu/h200_prologue_round.sh reduce # (the split reduce as one maximum, in-order sums and one
#       division; the warp-merge buffer padded) the split-KV, fused, fused-RoPE, invariant and merge checks,
#       ab_attention.py decode problems against ab_ticket_attention.cu (bits differ wherever there are
#       several splits), trace_decode.py, the engine smoke test
#   bash benches/gpu/h200_prologue_round.sh final  # every kernel check, the prefill and decode kernel labs and
#       the engine decode bench (packed into $OUT/bench.tgz), conformance at CI scale on the optimized engine
#       and, beside it, the GPU-scale qwen3-8b subset (LOGIT, SPLITK, PAGED)
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
V=benches/gpu/ab_variants

# checks, ab, NCU_METRICS and ncu_ab: benches/gpu/_env.sh; the decode profiles add DRAM throughput
NCU_METRICS+=",dram__throughput.avg.pct_of_peak_sustained_elapsed"

# ncu_decode PROBLEM TAG: split_kv_partials_d128 on ab_attention.py's decode problem PROBLEM, the base's launch
# first, then the tree's
ncu_decode() { ncu_ab split_kv_partials_d128 ab_base9_attention.cu decode "$1" "ncu_decode_$2.txt"; }

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
build_kernels
case "${1:-ab}" in
ab)
  checks 240 check_kernels_attention.log prefill splitkv fused fused_rope invariant
  ab 240 ab_base9_attention.cu ab_attention.log
  ncu_decode 1 1x4096
  ncu_decode 4 8x4096
  ;;
ticket)
  checks 300 check_kernels_ticket.log
  ab 200 ab_base9_attention.cu ab_attention_ticket.log
  ncu_decode 1 1x4096_ticket
  ncu_decode 4 8x4096_ticket
  smoke 120
  ;;
fold)
  checks 200 check_kernels_fold.log splitkv fused fused_rope invariant
  ab 150 ab_ticket_attention.cu ab_attention_fold_vs_ticket.log --only decode --rounds 5
  ab 150 ab_base9_attention.cu ab_attention_fold.log --only decode --rounds 5
  ;;
trace)
  timeout 300 python3 benches/gpu/trace_decode.py --problems 1:300 1:1024 1:4096 1:16384 8:300 8:4096 32:1024 \
    > "$OUT/trace_decode.log" 2>&1
  echo "trace rc=$?"; cat "$OUT/trace_decode.log" | tail -150
  ;;
reduce)
  checks 200 check_kernels_reduce.log splitkv fused fused_rope invariant merge
  ab 150 ab_ticket_attention.cu ab_attention_reduce_vs_ticket.log --only decode --rounds 5
  timeout 200 python3 benches/gpu/trace_decode.py --problems 1:300 1:1024 1:4096 1:16384 8:300 8:4096 32:1024 \
    > "$OUT/trace_decode_reduce.log" 2>&1
  echo "trace rc=$?"; grep -E "^B=|span|fold|merge warps|whole" "$OUT/trace_decode_reduce.log" | head -80
  smoke 120
  ;;
final)
  checks 200 check_kernels_final.log
  run_benches 420 "kernel_prefill or kernel_decode or engine_decode"
  pack_bench
  # conformance at CI scale, and at the GPU scale the qwen3-8b subset (LOGIT, SPLITK, PAGED), side by side
  conformance_gpu 200 qwen3-8b conformance_gpu_qwen3-8b.log > "$OUT/conformance_gpu_qwen3-8b.summary" &
  conformance_ci 200
  wait
  cat "$OUT/conformance_gpu_qwen3-8b.summary"; rm -f "$OUT/conformance_gpu_qwen3-8b.summary"
  ;;
*)
  echo "unknown mode $1" >&2; exit 2
  ;;
esac
