#!/usr/bin/env bash
# The seventh session's rounds on the H200 (logs under $OUT): the chunked sampling kernels and the
# lookahead decode step.
#   bash benches/gpu/h200_lookahead_round.sh checks    # every kernel check (with --time: sampling timings),
#       the engine smoke test (with the lookahead on/off section), the kernel lab of small kernels
#       (RMSNorm, RoPE, sampling; reports packed into $OUT/bench.tgz)
#   bash benches/gpu/h200_lookahead_round.sh profile   # profile_decode's alternating A/B of the lookahead
#       step off (sync) and on (default), greedy and at temperature 1, batch 1 / 8 / 64 / 256 of both
#       model shapes, with the graph timeline (and the GPU's idle gap between steps) at batch 1
#   bash benches/gpu/h200_lookahead_round.sh agentic   # the agentic workload (packed into $OUT/bench.tgz), then
#       the conformance clauses of turns, sampling, memory, state and invariance at the qwen3-0.6b shape
#   bash benches/gpu/h200_lookahead_round.sh topk      # the sampling checks and timings, the small-kernel lab and
#       the engine smoke test, for the candidate path of small-top-k rows
#   bash benches/gpu/h200_lookahead_round.sh final     # every kernel check, the engine smoke test, conformance at
#       CI scale, and decode steps greedy / t=1 / Qwen3's suggested sampling at batch 1 and 64
#   bash benches/gpu/h200_lookahead_round.sh last      # the sampling checks and timings (top-p rows over
#       candidates), the engine smoke test, conformance at CI scale
#   bash benches/gpu/h200_lookahead_round.sh record    # the sampling checks, engine_decode and the small-kernel
#       lab (packed into $OUT/bench.tgz), and the conformance suite at CI scale on the optimized engine
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
build_kernels
case "${1:-checks}" in
checks)
  timeout 240 python3 benches/gpu/check_kernels.py --time > "$OUT"/check_kernels.log 2>&1; echo "check_kernels rc=$?"
  grep -E "FAIL" "$OUT"/check_kernels.log | head -20; grep -E "^sample " "$OUT"/check_kernels.log; tail -1 "$OUT"/check_kernels.log
  smoke 150
  run_benches 150 "kernel_small"
  grep -E "^\| sample" "$OUT/bench/kernel_small.md"
  pack_bench
  ;;
profile)
  timeout ${PROFILE_S:-420} python3 benches/gpu/profile_decode.py --models qwen3-8b qwen3-0.6b --batches 1 8 64 256 \
    --profile-batches --timeline-batches 1 --variants sync default "t=1 sync" t=1 --rounds 3 --out "$OUT" \
    > "$OUT"/profile_decode.log 2>&1
  echo "profile rc=$?"
  grep -v "^     " "$OUT"/profile_decode.log | grep -v "Warn\|_warn" | tail -40
  ;;
record)
  timeout 120 python3 benches/gpu/check_kernels.py --only sampling graph > "$OUT"/check_kernels_sampling.log 2>&1
  echo "check_kernels (sampling, graph) rc=$?"; grep -E "FAIL" "$OUT"/check_kernels_sampling.log | head; tail -1 "$OUT"/check_kernels_sampling.log
  run_benches 300 "engine_decode or kernel_small"
  grep -E "turnkv|: x transformers|% of the memory roofline" "$OUT/bench/engine_decode.md" | head -30
  grep -E "^\| sample" "$OUT/bench/kernel_small.md"
  pack_bench
  conformance_ci 200
  ;;
agentic)
  run_benches 260 "agentic"
  grep -E "^\| (resume|re-prefill|transformers)" "$OUT/bench/agentic.md" | head -6
  pack_bench
  timeout 330 python3 -m pytest conformance -q -rs -p no:cacheprovider --engine optimized --durations=8 \
    --conformance-scale gpu --oracle-device cuda -k "qwen3-0.6b and (turn or sample or mem or state or invariant)" \
    > "$OUT"/conformance_gpu_qwen3-0.6b.log 2>&1
  echo "conformance qwen3-0.6b rc=$?"; grep -E "CONFORMANCE FAILURE|^FAILED" "$OUT"/conformance_gpu_qwen3-0.6b.log | head -8
  tail -1 "$OUT"/conformance_gpu_qwen3-0.6b.log
  ;;
topk)
  timeout 150 python3 benches/gpu/check_kernels.py --only sampling graph --time > "$OUT"/check_kernels_topk.log 2>&1
  echo "check_kernels rc=$?"; grep -E "FAIL" "$OUT"/check_kernels_topk.log | head -20
  grep -E "^sample " "$OUT"/check_kernels_topk.log; tail -1 "$OUT"/check_kernels_topk.log
  run_benches 150 "kernel_small"
  grep -E "^\| sample" "$OUT/bench/kernel_small.md"
  pack_bench
  smoke 150
  ;;
final)
  timeout 200 python3 benches/gpu/check_kernels.py > "$OUT"/check_kernels.log 2>&1; echo "check_kernels rc=$?"
  grep -E "FAIL" "$OUT"/check_kernels.log | head -20; tail -1 "$OUT"/check_kernels.log
  smoke 120
  conformance_ci 200
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-8b qwen3-0.6b --batches 1 64 --profile-batches \
    --variants default t=1 qwen3-sampling --rounds 2 --out "$OUT" > "$OUT"/profile_sampling.log 2>&1
  echo "profile rc=$?"; grep -v "^     " "$OUT"/profile_sampling.log | grep -v "Warn\|_warn" | tail -14
  ;;
last)
  timeout 100 python3 benches/gpu/check_kernels.py --only sampling graph --time > "$OUT"/check_kernels_top_p.log 2>&1
  echo "check_kernels rc=$?"; grep -E "FAIL" "$OUT"/check_kernels_top_p.log | head -20
  grep -E "^sample B=1 |^sample B=64 " "$OUT"/check_kernels_top_p.log; tail -1 "$OUT"/check_kernels_top_p.log
  smoke 100
  conformance_ci 170
  ;;
esac
