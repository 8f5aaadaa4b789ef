#!/usr/bin/env bash
# The next device call after the fifty-eighth session (run from the repository root, any H100 or H200), written
# when that session's device time ran out: the spread split-K fold is on by default (runner.wg_spread_fold).
#   bash benches/gpu/fiftyeighth_round.sh next    # the per-CTA trace at qwen3-0.6b batch 32 and 64 with its second
#                       # table (the slowest CTA's marks, each rank's last MMA: what a cluster of o_proj or down
#                       # waits on), the engine decode bench (the x-transformers target, not rerun since the
#                       # fifty-fourth session), the qwen3-0.6b conformance clauses at GPU scale (a third of the
#                       # suite's non-8B clauses did not run with the spread fold on), and the qwen3-8b clauses
#                       # where they fit (about 96 GiB: an H200)
#   bash benches/gpu/fiftyeighth_round.sh trace   # the traces only
source benches/gpu/_env.sh
mode=${1:-next}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
date +%T; build_kernels; date +%T
for b in 32 64; do
  timeout 90 python3 benches/gpu/trace_wg.py --batch "$b" > "$OUT/trace_wg_tails_b$b.log" 2>&1
  echo "trace_wg b$b rc=$?"; grep -v Warning "$OUT/trace_wg_tails_b$b.log"; date +%T
done
if [ "$mode" = next ]; then
  run_benches 230 engine_decode
  grep -E "^\| qwen3-[0-9.]+b \| (1|32|64) \|" "$OUT/bench/engine_decode.md" | cut -c1-110
  mv "$OUT/bench/run_gpu.log" "$OUT/run_gpu_decode.log"; pack_bench; mv "$OUT/bench.tgz" "$OUT/bench_decode.tgz"
  date +%T
  conformance_8b_if_it_fits 200
  conformance_gpu 300 qwen3-0.6b conformance_gpu_qwen3-0.6b.log
fi
date +%T
exit 0
