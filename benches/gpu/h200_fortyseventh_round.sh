#!/usr/bin/env bash
# Device calls for after the forty-seventh session (run from the repository root). That session's four H100 calls used
# h200_fortysixth_round.sh (small, agentic) and conf (the TURN tests); these are what its budget left undone:
#   bash benches/gpu/h200_fortyseventh_round.sh decode80  # on an 80 GB H100: the engine decode bench, to see whether
#                                                         # its qwen3-8b transformers peers fit beside the engine (they
#                                                         # are reported, not timed, where they run out of memory;
#                                                         # run in the forty-eighth session: every peer fit)
#   bash benches/gpu/h200_fortyseventh_round.sh agentic   # on an H200: the agentic bench with the memory fix (the
#                                                         # engine freed before transformers' model is built)
#   AGENTIC_SECS=540 bash benches/gpu/h200_fortyseventh_round.sh agentic  # on an 80 GB H100, where transformers'
#                                                         # re-prefill runs in sub-batches and needs the longer limit
source benches/gpu/_env.sh
mode=${1:-decode80}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
date +%T; build_kernels; date +%T
if [ "$mode" = decode80 ]; then
  bench_packed 420 "engine_decode" "run_gpu_engine_decode.log"
  mv "$OUT/bench.tgz" "$OUT/bench_engine_decode.tgz"
  grep -E "^\[(MET |miss|n/a )\]|SKIPPED|out of memory" "$OUT/run_gpu_engine_decode.log" | cut -c1-200 | head -20
fi
if [ "$mode" = agentic ]; then
  bench_packed "${AGENTIC_SECS:-330}" "test_agentic and not trickle" "run_gpu_agentic.log"
  mv "$OUT/bench.tgz" "$OUT/bench_agentic.tgz"
  grep -E "^\[(MET |miss|n/a )\]|SKIPPED" "$OUT/run_gpu_agentic.log" | cut -c1-200
fi
date +%T
exit 0
