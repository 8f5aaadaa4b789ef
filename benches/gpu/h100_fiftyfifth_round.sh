#!/usr/bin/env bash
# The fifty-fifth session's device calls (run from the repository root, any H100 or H200).
#   bash benches/gpu/h100_fiftyfifth_round.sh ab     # the kernel checks of the fifty-fourth session's final tree
#                       # (early, qk: their decode_positions helper; splitkv, wg-norm), then the one-process A/B at
#                       # qwen3-0.6b, batch 32 and 64: o_proj and down (the residual epilogue) on 1, 2, 4 (the
#                       # rule, default) and 8 CTAs a unit (profile_decode.py's res-p*), with the graph timelines
#   bash benches/gpu/h100_fiftyfifth_round.sh next   # the agentic bench; on an H200 first the qwen3-8b conformance
#                       # clauses at GPU scale (about 96 GiB)
#   bash benches/gpu/h100_fiftyfifth_round.sh l2     # probe_kv_l2.py: a decode attention's time with its K/V out
#                       # of L2, in it, in it behind one or two layers' GEMMs, and prefetched beside them; then, on
#                       # an H200, the qwen3-8b conformance clauses at GPU scale
#   bash benches/gpu/h100_fiftyfifth_round.sh bench  # (not run: nothing it measures changed) the engine decode bench
#                       # (the x-transformers target), then the qwen3-0.6b conformance clauses at GPU scale
source benches/gpu/_env.sh
mode=${1:-ab}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
date +%T; [ "$mode" = l2 ] || build_kernels; date +%T   # l2: the probe compiles its modules on first use
if [ "$mode" = ab ]; then
  checks 200 check_kernels.log early qk splitkv wg-norm; date +%T
  timeout 300 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 32 64 --timeline-batches 32 --profile-batches \
    --variants default res-p1 res-p2 res-p8 --rounds 3 > "$OUT/profile_decode_res.log" 2>&1
  echo "profile_decode rc=$?"; grep -v USDT "$OUT/profile_decode_res.log" | grep -vi warn | grep -E "^ +(32|64) |=="
  grep -E "skinny_wg|split_kv|graph timeline" "$OUT/profile_decode_res.log" | head -40
fi
if [ "$mode" = next ]; then
  conformance_8b_if_it_fits 150
  bench_packed 280 "test_agentic and not trickle" run_gpu_agentic.log
  mv "$OUT/bench.tgz" "$OUT/bench_agentic.tgz"
fi
if [ "$mode" = l2 ]; then
  timeout 200 python3 benches/gpu/probe_kv_l2.py > "$OUT/probe_kv_l2.log" 2>&1; echo "probe_kv_l2 rc=$?"
  grep -v USDT "$OUT/probe_kv_l2.log" | grep -vi warn | tail -16
  conformance_8b_if_it_fits 150
fi
if [ "$mode" = bench ]; then
  run_benches 230 engine_decode
  grep -E "^\| qwen3-[0-9.]+b \| (1|32|64) \|" "$OUT/bench/engine_decode.md" | cut -c1-110
  mv "$OUT/bench/run_gpu.log" "$OUT/run_gpu_decode.log"; pack_bench; mv "$OUT/bench.tgz" "$OUT/bench_decode.tgz"
  conformance_gpu 250 qwen3-0.6b conformance_gpu_qwen3-0.6b.log
fi
date +%T
exit 0
