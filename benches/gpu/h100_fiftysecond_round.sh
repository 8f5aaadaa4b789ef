#!/usr/bin/env bash
# The fifty-second session's device call (run from the repository root, any H100 or H200). That session found the
# transformers peer's slow first runs to be cuDNN SDPA's per-shape plans (benches/gpu/profile_agentic_peer.py with and
# without cuDNN's backend), which a generate loop pays at every decode step; the benches' peer now runs without cuDNN's
# backend (--hf-sdpa, default _bench.PEER_SDPA). This measures what that changes:
#   bash benches/gpu/h100_fiftysecond_round.sh peers   # the engine decode bench with the new peer, then with torch's
#                                                      # choice (--hf-sdpa torch), then the agentic bench (new peer)
#   bash benches/gpu/h100_fiftysecond_round.sh repeat  # on another host: the engine decode bench and the agentic bench
#                                                      # with the new peer, then the engine decode bench again (how
#                                                      # much that peer moves between runs and hosts)
#   bash benches/gpu/h100_fiftysecond_round.sh agentic # the agentic bench with its ceilings measured before its runs,
#                                                      # then the ceilings again in a fresh process right after it
#   bash benches/gpu/h100_fiftysecond_round.sh profile # for the next session (not run yet): where qwen3-0.6b's batch-32
#                                                      # step goes (the one peer-relative target within reach of the
#                                                      # peer without cuDNN: 18.3x, 20x needs a step 8.6% shorter):
#                                                      # the graph's kernel timeline and an eager step's kernel times
source benches/gpu/_env.sh
mode=${1:-peers}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
date +%T; build_kernels; date +%T
# decode_bench SECONDS TAG ARGS...: the engine decode bench (reports packed as $OUT/bench_decode_TAG.tgz)
decode_bench() {
  local secs=$1 tag=$2; shift 2
  echo "engine decode ($tag):"; run_benches "$secs" engine_decode "$@"
  grep -E "^\| qwen3-[0-9.]+b \| (1|32|256) \| transformers" "$OUT/bench/engine_decode.md" | cut -c1-90
  mv "$OUT/bench/run_gpu.log" "$OUT/run_gpu_decode_$tag.log"; pack_bench; mv "$OUT/bench.tgz" "$OUT/bench_decode_$tag.tgz"
}
# agentic_bench: the agentic bench but its trickle (reports packed as $OUT/bench_agentic.tgz)
agentic_bench() {
  bench_packed "${AGENTIC_SECS:-260}" "test_agentic and not trickle" "run_gpu_agentic.log"
  mv "$OUT/bench.tgz" "$OUT/bench_agentic.tgz"
}
# ceilings_now WHEN: the copy and GEMM ceilings measured in a fresh process
ceilings_now() {
  python3 -c "import sys; sys.path.insert(0, 'benches'); from _ceilings import measure_ceilings; from _bench import Scale
print('ceilings $1:', measure_ceilings(Scale('gpu')))"
}
if [ "$mode" = peers ]; then
  decode_bench 150 no_cudnn
  date +%T
  decode_bench 150 torch_sdpa --hf-sdpa torch
  date +%T
  agentic_bench
fi
if [ "$mode" = repeat ]; then
  decode_bench 150 no_cudnn
  date +%T
  agentic_bench
  date +%T
  decode_bench 150 no_cudnn_again
fi
if [ "$mode" = agentic ]; then
  ceilings_now "before the bench"
  agentic_bench
  ceilings_now "after the bench"
fi
if [ "$mode" = profile ]; then
  timeout 400 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 32 --profile-batches 32 \
    --timeline-batches 32 --variants default --rounds 3 > "$OUT/profile_decode_06b_b32.log" 2>&1
  echo "profile_decode rc=$?"; grep -v USDT "$OUT/profile_decode_06b_b32.log" | tail -60
fi
date +%T
exit 0
