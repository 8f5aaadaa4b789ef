#!/usr/bin/env bash
# The ninth session's rounds on the H200 (logs under $OUT): the attention kernels' K/V copies from a
# row-offset table filled a tile ahead (one block-table lookup per row instead of one per 16-byte chunk),
# the per-pass row limits of paged prefill in shared memory, and the unmasked softmax path taken per warp.
# The files compared live in benches/gpu/ab_variants/ (kept in the commit that added this script, removed
# after): ab_base_attention.cu is `git show e6b7ac3:optimized/kernels/attention.cu` (the eighth session's
# kernels, the base of every A/B), ab_mid_attention.cu the tree of the `ab` call, the others below.
#   bash benches/gpu/h200_copies_round.sh ab     # the attention checks (prefill, split-KV, fused decode, fused
#       RoPE, batch-invariant attention), ab_attention.py against the base (bits and time, prefill and decode
#       lab problems), Nsight Compute instruction counts of both prefill kernels at 8 x 1024 over 4096
#   bash benches/gpu/h200_copies_round.sh ab2    # (after the row tables' skip mask and the softmax of both
#       row tiles in one block) the attention checks, ab_attention.py against the base and against the `ab`
#       call's tree, Nsight Compute counts of the two-tile kernel (`ab` tree, then this one), and the prefill
#       and decode kernel labs (packed into $OUT/bench.tgz)
#   bash benches/gpu/h200_copies_round.sh variants  # ab_attention.py, prefill problems, of four files against
#       ab_mid_attention.cu (the `ab` call's tree): ab_call2_attention.cu (the `ab2` call's tree; in that call it
#       was the working tree), ab_v3_attention.cu (it with one rescale vote per row tile), ab_joint_attention.cu
#       (mid + the softmax of both row tiles in one block: the tree from then on), ab_skip_attention.cu (mid +
#       the row tables' skip mask and 16-byte offset loads)
#   bash benches/gpu/h200_copies_round.sh final   # on the kept tree: every kernel check, ab_attention.py against
#       the base, the prefill and decode kernel labs (packed into $OUT/bench.tgz), the engine smoke test and
#       the conformance suite at CI scale on the optimized engine
#   bash benches/gpu/h200_copies_round.sh qasync  # (the prefill kernels' Q tile by cp.async, landing with the first
#       K/V tile) the prefill checks, ab_attention.py against ab_joint_attention.cu (the `final` call's kernels)
#       and against the base, and the prefill kernel lab (packed into $OUT/bench.tgz); its tree is kept
#       (ab_qasync_attention.cu)
#   bash benches/gpu/h200_copies_round.sh verify  # on the kept tree: every kernel check, the engine smoke test and
#       the conformance suite at CI scale on the optimized engine
#   bash benches/gpu/h200_copies_round.sh steps   # (the prefill Q tile and output rows addressed by stepping
#       (token, head) instead of dividing by G, Q's validity from the row table) the prefill checks,
#       ab_attention.py against ab_qasync_attention.cu (the `qasync` call's kernels), the prefill kernel lab
#       (packed into $OUT/bench.tgz), the engine smoke test and conformance at CI scale
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
V=benches/gpu/ab_variants

# checks, all_checks, ab, NCU_METRICS and ncu_ab: benches/gpu/_env.sh

# ncu_counts: instructions, HMMA and the stalls of the two prefill kernels (64-row and x2) on 8 x 1024 over
# 4096, the base's launch first, then the working tree's (ab_attention.py runs base, then new)
ncu_counts() {
  local k
  for k in 'paged_prefill_d128$' 'paged_prefill_d128_x2'; do
    ncu_ab "$k" ab_base_attention.cu prefill 0 "ncu_prefill_${k//[^a-z0-9_]/}.txt"
  done
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
build_kernels
case "${1:-ab}" in
ab)
  checks 200 check_kernels_attention.log prefill splitkv fused fused_rope invariant
  ab 240 ab_base_attention.cu ab_attention.log
  ncu_counts
  ;;
ab2)
  checks 200 check_kernels_attention.log prefill splitkv fused fused_rope invariant
  ab 200 ab_base_attention.cu ab_attention.log
  ab 150 ab_mid_attention.cu ab_attention_mid.log --only prefill
  ncu_ab paged_prefill_d128_x2 ab_mid_attention.cu prefill 0 ncu_prefill_x2_mid_new.txt
  run_benches 300 "kernel_prefill or kernel_decode"
  pack_bench
  ;;
variants)
  for f in ab_call2_attention.cu ab_v3_attention.cu ab_joint_attention.cu ab_skip_attention.cu; do
    arg=(--new "$V/$f")
    ab 120 ab_mid_attention.cu "ab_variant_${f%.cu}.log" "${arg[@]}" --only prefill
  done
  ;;
final)
  all_checks 300 check_kernels_final.log
  ab 200 ab_base_attention.cu ab_attention.log
  run_benches 300 "kernel_prefill or kernel_decode"
  pack_bench
  smoke 120
  conformance_ci 240
  ;;
qasync)
  checks 200 check_kernels_prefill.log prefill fused_rope invariant
  ab 150 ab_joint_attention.cu ab_attention_vs_final.log --only prefill
  ab 150 ab_base_attention.cu ab_attention.log --only prefill
  run_benches 200 "kernel_prefill"
  pack_bench
  ;;
verify)
  all_checks 300 check_kernels_verify.log
  smoke 120
  conformance_ci 240
  ;;
steps)
  checks 150 check_kernels_prefill.log prefill fused_rope invariant
  ab 100 ab_qasync_attention.cu ab_attention_vs_qasync.log --only prefill
  run_benches 120 "kernel_prefill"
  pack_bench
  smoke 100
  conformance_ci 200
  ;;
*)
  echo "unknown mode $1"; exit 2
  ;;
esac
