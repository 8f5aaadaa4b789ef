#!/usr/bin/env bash
# Twenty-second and twenty-third sessions' device calls: the warpgroup GEMM (skinny_wg.cu, 17-64 rows) against cuBLAS
# (docs/performance/gemm.md, "The warpgroup GEMM"; run from the repository root):
#   bash benches/gpu/h200_wg_round.sh MODE
#   first:  check_kernels.py --only wg (stops here on a failure), probe_wg.py on the qwen3-0.6b and qwen3-8b GEMMs at
#           32 and 64 rows, then the engine A/B (profile_decode.py: default against the wg-* variants) at qwen3-8b
#           and qwen3-0.6b batch 32 and 64
#   rule:   the engine A/B with the split rule (ops.skinny_wg_split) by role and x tile: profile_decode.py at qwen3-8b and
#           qwen3-0.6b batch 32 and 64, qwen3-0.6b batch 64 after 1664 tokens
#   ab:     (twenty-third session, the kernel on by default: runner.WG_GEMM) the engine A/B, default against wg-off
#           (every decode GEMM on cuBLAS) and wg-rule (the LM head on cuBLAS) at qwen3-8b and qwen3-0.6b batch 32 and
#           64, then the engine decode bench (its transformers peers included)
#   final:  with the kernel on by default: the engine smoke test, conformance at CI scale and the GPU-scale qwen3-8b
#           clauses, the engine A/B at qwen3-0.6b batch 64 after 1664 tokens (the agentic workload's decode), then the agentic bench
#   labs:   the kernel labs for decode attention and paged prefill on the current tree (their SDPA peers included)
#   TAG: the files' suffix (default _MODE)
source benches/gpu/_env.sh
mode=${1:-first}
tag=${TAG:-_$mode}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
if [ "$mode" = first ]; then
  timeout 200 python3 benches/gpu/check_kernels.py --only wg > "$OUT/check_kernels_wg$tag.log" 2>&1
  rc=$?; echo "check_kernels wg rc=$rc"; grep -E "FAIL" "$OUT/check_kernels_wg$tag.log" | cut -c1-300 | head -12
  tail -3 "$OUT/check_kernels_wg$tag.log"
  [ $rc -ne 0 ] && exit 1   # (a hang or a wrong result: nothing after it is worth the device time)
  for m in qwen3-8b qwen3-0.6b; do
    timeout 120 python3 benches/gpu/probe_wg.py --model $m --out "$OUT" --tag "$tag" > "$OUT/probe_wg${tag}_$m.log" 2>&1
    echo "probe_wg $m rc=$?"; cut -c1-330 "$OUT/probe_wg${tag}_$m.log"
  done
  timeout 170 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 32 64 --rounds 3 --profile-batches \
    --variants default wg-1 wg-s2 wg-s4 wg-gu > "$OUT/profile_wg${tag}_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -E "^\s+(32|64) +" "$OUT/profile_wg${tag}_8b.log"
  timeout 110 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 32 64 --rounds 3 --profile-batches \
    --variants default wg-1 wg-s4 wg-s8 > "$OUT/profile_wg${tag}_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+(32|64) +" "$OUT/profile_wg${tag}_06b.log"
fi
if [ "$mode" = rule ]; then
  timeout 200 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 32 64 --rounds 3 --profile-batches \
    --variants default wg-s2 wg-rule wg-head wg-head32 > "$OUT/profile_wg${tag}_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -E "^\s+(32|64) +" "$OUT/profile_wg${tag}_8b.log"
  timeout 120 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 32 64 --rounds 3 --profile-batches \
    --variants default wg-rule wg-head wg-head32 > "$OUT/profile_wg${tag}_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+(32|64) +" "$OUT/profile_wg${tag}_06b.log"
  timeout 100 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 64 --prompt 1664 --rounds 3 --profile-batches \
    --variants default wg-head wg-head32 > "$OUT/profile_wg${tag}_06b_1664.log" 2>&1
  echo "profile 0.6b 1664 rc=$?"; grep -E "^\s+64 +" "$OUT/profile_wg${tag}_06b_1664.log"
fi
if [ "$mode" = ab ]; then   # the tree with the warpgroup GEMM on by default (runner.WG_GEMM)
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 32 64 --rounds 3 --profile-batches 32 \
    --variants default wg-off wg-rule > "$OUT/profile_wg${tag}_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -E "^\s+(32|64) +" "$OUT/profile_wg${tag}_8b.log"
  timeout 100 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 32 64 --rounds 3 \
    --variants default wg-off wg-rule > "$OUT/profile_wg${tag}_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+(32|64) +" "$OUT/profile_wg${tag}_06b.log"
  bench_packed 170 "engine_decode" run_gpu_engine_decode_wg.log
fi
if [ "$mode" = final ]; then   # the tree with the warpgroup GEMM on by default (runner.WG_GEMM)
  smoke 100; mv "$OUT/engine_smoke.log" "$OUT/engine_smoke_wg${tag}.log"
  conformance_both 150 conformance_gpu_qwen3-8b_wg.log 200
  mv "$OUT/conformance_ci_optimized.log" "$OUT/conformance_ci_optimized_wg.log"
  timeout 90 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 64 --prompt 1664 --rounds 3 \
    --variants default wg-off > "$OUT/profile_wg${tag}_06b_1664.log" 2>&1
  echo "profile 0.6b 1664 rc=$?"; grep -E "^\s+64 +" "$OUT/profile_wg${tag}_06b_1664.log"
  bench_packed 240 "agentic" run_gpu_agentic_wgemm.log
fi
if [ "$mode" = labs ]; then
  bench_packed 240 "kernel_decode or kernel_prefill" run_gpu_kernel_labs_wg.log
fi
