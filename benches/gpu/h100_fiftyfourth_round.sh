#!/usr/bin/env bash
# The fifty-fourth session's device calls (run from the repository root, any H100 or H200). That session let a
# decode step's attention, where qk_norm_rope is its own launch (17-64 rows), copy its first two tiles' cached K/V
# before its PDL wait (split_kv_early_partials, ops.split_kv_decode(early=True), runner.early_attention).
#   bash benches/gpu/h100_fiftyfourth_round.sh check   # the kernel checks (the early attention, the split-KV
#                       # decode, the fused decode kernels, the folded-norm GEMMs of the fifty-third session's final
#                       # tree, the elementwise kernels) beside the qwen3-8b conformance clauses at GPU scale (decode
#                       # steps of 17-64 rows: the fold and the early attention), then the one-process A/B at
#                       # qwen3-0.6b and qwen3-8b, batch 32 and 64: the default against attn-late (the attention
#                       # waiting first), attn-trigger (qk_norm_rope letting it be scheduled before its own wait)
#                       # and qk-all (qk_norm_rope in the attention launch at any batch)
#   bash benches/gpu/h100_fiftyfourth_round.sh large   # (qk_norm_rope in the attention up to 64 rows) the A/B at
#                       # batch 128 and 256: default, attn-late, attn-trigger, qk-all; then the bench, then the
#                       # qwen3-0.6b conformance clauses at GPU scale
#   bash benches/gpu/h100_fiftyfourth_round.sh conformance  # the qwen3-0.6b clauses at GPU scale
#   bash benches/gpu/h100_fiftyfourth_round.sh bench   # the engine decode bench (the x-transformers target)
#   bash benches/gpu/h100_fiftyfourth_round.sh next    # (not run: no device time left) the agentic bench, whose decode
#                       # steps of 64 rows now take the one launch, and, on an H200, the qwen3-8b conformance clauses
source benches/gpu/_env.sh
mode=${1:-check}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
date +%T; build_kernels; date +%T
if [ "$mode" = check ]; then
  ( checks 200 check_kernels_early.log early splitkv fused qk wg-norm elementwise ) > "$OUT/checks.summary" &
  conformance_gpu 200 qwen3-8b conformance_gpu_qwen3-8b.log
  wait; cat "$OUT/checks.summary"; rm -f "$OUT/checks.summary"
  date +%T
  timeout 260 python3 benches/gpu/profile_decode.py --models qwen3-0.6b qwen3-8b --batches 32 64 --profile-batches \
    --timeline-batches 32 --variants default attn-late attn-trigger qk-all --rounds 3 > "$OUT/profile_decode_early.log" 2>&1
  echo "profile_decode rc=$?"; grep -v USDT "$OUT/profile_decode_early.log" | grep -vi warn | grep -E "^ +(32|64) |==" 
  grep -E "split_kv|qk_norm_rope|graph timeline" "$OUT/profile_decode_early.log" | head -24
fi
if [ "$mode" = large ]; then   # (after fuse_qk_max_rows became 64) the larger steps, where the two launches stay;
                              # then the engine decode bench
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-0.6b qwen3-8b --batches 128 256 \
    --variants default attn-late attn-trigger qk-all --rounds 3 > "$OUT/profile_decode_large.log" 2>&1
  echo "profile_decode rc=$?"; grep -v USDT "$OUT/profile_decode_large.log" | grep -vi warn | grep -E "^ +[0-9]+ |=="
  date +%T
fi
if [ "$mode" = conformance ]; then
  conformance_gpu 380 qwen3-0.6b conformance_gpu_qwen3-0.6b.log
fi
if [ "$mode" = bench ] || [ "$mode" = large ]; then
  run_benches 230 engine_decode
  grep -E "^\| qwen3-[0-9.]+b \| (1|32|64) \|" "$OUT/bench/engine_decode.md" | cut -c1-110
  mv "$OUT/bench/run_gpu.log" "$OUT/run_gpu_decode.log"; pack_bench; mv "$OUT/bench.tgz" "$OUT/bench_decode.tgz"
  date +%T
fi
if [ "$mode" = large ]; then  # what time is left: the qwen3-8b clauses where they fit (about 96 GiB: an H200), then
                              # the qwen3-0.6b ones (decode steps of 17-64 rows now one launch)
  conformance_8b_if_it_fits 120
  conformance_gpu 300 qwen3-0.6b conformance_gpu_qwen3-0.6b.log
fi
if [ "$mode" = next ]; then
  conformance_8b_if_it_fits 120
  bench_packed 280 "test_agentic and not trickle" run_gpu_agentic.log
  mv "$OUT/bench.tgz" "$OUT/bench_agentic.tgz"
fi
date +%T
exit 0
