#!/usr/bin/env bash
# The fifty-ninth session's device calls (run from the repository root, any H100 or H200): the edge probe
# (probe_edge.py: the PDL wait against a flag in global memory), the layer GEMMs' 4-stage warpgroup configurations
# (runner.wg_stages, by role: two CTAs a multiprocessor at 32 x rows, so that a GEMM's CTAs can be resident beside the
# GEMM before it; docs/performance/decode_step.md), and the bench and conformance runs the fifty-eighth left.
#   bash benches/gpu/fiftyninth_round.sh a   # the edge probe; the kernel checks (wg, wg-norm: 4 stages bitwise the
#                       # default); the per-CTA trace at qwen3-0.6b batch 32, spread against s4; the one-process
#                       # A/B spread against s4 (and s4-mlp: not qkv), qwen3-0.6b batch 32 and 64 (graph timeline
#                       # at 32), qwen3-8b batch 32 and 64
#   bash benches/gpu/fiftyninth_round.sh tiny  # what about 5 minutes hold: the kernel checks (the default path's
#                       # spread kernels changed), the edge probe, then the qwen3-0.6b batch-32 A/B (spread, s4, s4-mlp)
#   bash benches/gpu/fiftyninth_round.sh b   # the engine decode bench against transformers, of the tree as copied
#   bash benches/gpu/fiftyninth_round.sh c   # the qwen3-0.6b conformance clauses at GPU scale (and qwen3-8b's
#                       # where they fit), of the tree as copied
source benches/gpu/_env.sh
mode=${1:-a}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
probe() {
  timeout 45 python3 benches/gpu/probe_edge.py > "$OUT/probe_edge.log" 2>&1; echo "probe_edge rc=$?"
  grep -v Warning "$OUT/probe_edge.log"
}
[ "$mode" = a ] && probe
date +%T; build_kernels; date +%T
if [ "$mode" = a ]; then
  checks 150 check_kernels.log wg-norm wg; date +%T
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 32 64 --timeline-batches 32 \
    --profile-batches --variants spread s4 s4-mlp --rounds 3 > "$OUT/profile_decode_s4_0.6b.log" 2>&1
  echo "profile_decode 0.6b rc=$?"; grep -E "^ +(32|64) |==" "$OUT/profile_decode_s4_0.6b.log"
  grep -E "graph timeline|skinny_wg|split_kv" "$OUT/profile_decode_s4_0.6b.log" | head -30; date +%T
  timeout 120 python3 benches/gpu/trace_wg.py --batch 32 --variants spread s4 > "$OUT/trace_wg_s4_b32.log" 2>&1
  echo "trace_wg b32 rc=$?"; grep -v Warning "$OUT/trace_wg_s4_b32.log"; date +%T
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 32 64 --profile-batches \
    --variants spread s4 --rounds 3 > "$OUT/profile_decode_s4_8b.log" 2>&1
  echo "profile_decode 8b rc=$?"; grep -E "^ +(32|64) |==" "$OUT/profile_decode_s4_8b.log"; date +%T
elif [ "$mode" = tiny ]; then
  checks 90 check_kernels.log wg-norm wg; date +%T
  probe
  timeout 90 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 32 --profile-batches \
    --variants spread s4 s4-mlp --rounds 3 > "$OUT/profile_decode_s4_0.6b.log" 2>&1
  echo "profile_decode 0.6b rc=$?"; grep -E "^ +32 |==" "$OUT/profile_decode_s4_0.6b.log"; date +%T
else
  grep -n "self.wg_stages: dict" optimized/runner.py
fi
if [ "$mode" = b ]; then
  run_benches 400 engine_decode
  grep -E "^\| qwen3-[0-9.]+b \| (1|32|64) \|" "$OUT/bench/engine_decode.md" | cut -c1-110
  mv "$OUT/bench/run_gpu.log" "$OUT/run_gpu_decode.log"; pack_bench; mv "$OUT/bench.tgz" "$OUT/bench_decode.tgz"
elif [ "$mode" = c ]; then
  conformance_8b_if_it_fits 200
  conformance_gpu 400 qwen3-0.6b conformance_gpu_qwen3-0.6b.log
fi
date +%T
exit 0
