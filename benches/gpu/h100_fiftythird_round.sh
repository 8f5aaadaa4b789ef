#!/usr/bin/env bash
# The fifty-third session's device calls (run from the repository root, any H100 or H200). That session folded the
# add_rmsnorm between two warpgroup GEMMs of a decode step into them (ops.skinny_wg's residual epilogue and normed
# prologue, runner.fuse_norm_gemm): two launches fewer a layer at 17-64 rows, where qwen3-0.6b's batch-32 timeline
# (h100_fiftysecond_round.sh profile) spent 116 us of its 1334 us on the 56 add_rmsnorm launches.
#   bash benches/gpu/h100_fiftythird_round.sh check   # the kernel checks of the fused kernels (and the plain
#                                                     # warpgroup ones), then the one-process A/B (default against
#                                                     # norm-apart) at qwen3-0.6b and qwen3-8b, batch 32 and 64, with
#                                                     # the batch-32 graph timelines
#                                                     # (run twice: the first version of the fold, then this one)
#   bash benches/gpu/h100_fiftythird_round.sh conformance  # the conformance clauses at the qwen3-0.6b shape (GPU scale:
#                                                          # 64 sequences, decode steps of 17-64 rows)
#   bash benches/gpu/h100_fiftythird_round.sh bench   # the engine decode bench (the x-transformers target), then the
#                                                     # agentic bench
#   bash benches/gpu/h100_fiftythird_round.sh repeat  # the engine decode bench again (on another host: its peer)
source benches/gpu/_env.sh
mode=${1:-check}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
date +%T; build_kernels; date +%T
if [ "$mode" = check ]; then
  checks 150 check_kernels_wg_norm.log wg-norm wg
  date +%T
  timeout 300 python3 benches/gpu/profile_decode.py --models qwen3-0.6b qwen3-8b --batches 32 64 --profile-batches \
    --timeline-batches 32 --variants default norm-apart --rounds 3 > "$OUT/profile_decode_fold.log" 2>&1
  echo "profile_decode rc=$?"; grep -v USDT "$OUT/profile_decode_fold.log" | grep -vi warn | tail -70
fi
if [ "$mode" = conformance ]; then
  conformance_gpu 470 qwen3-0.6b conformance_gpu_qwen3-0.6b_fold.log
fi
# decode_bench TAG: the engine decode bench, its main rows, its log and reports (packed as $OUT/bench_decode_TAG.tgz)
decode_bench() {
  run_benches 200 engine_decode
  grep -E "^\| qwen3-[0-9.]+b \| (1|32|64) \|" "$OUT/bench/engine_decode.md" | cut -c1-110
  mv "$OUT/bench/run_gpu.log" "$OUT/run_gpu_decode$1.log"; pack_bench; mv "$OUT/bench.tgz" "$OUT/bench_decode$1.tgz"
}
if [ "$mode" = bench ]; then
  decode_bench ""
  date +%T
  bench_packed 280 "test_agentic and not trickle" run_gpu_agentic.log
  mv "$OUT/bench.tgz" "$OUT/bench_agentic.tgz"
fi
if [ "$mode" = repeat ]; then
  decode_bench _repeat
fi
date +%T
exit 0
