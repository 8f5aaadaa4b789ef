#!/usr/bin/env bash
# Fifteenth session's device calls on the staged skinny GEMM (skinny_gemm.cu, "The staged kernel"; run from the
# repository root):
#   bash benches/gpu/h200_staged_round.sh MODE
#   probe:  check_kernels.py --only staged skinny epilogue (CHECKS: other sections; the staged kernel against
#           float64 and its own launches, the register kernel after its epilogue became a helper), then
#           probe_blas.py at M = 1 and 8 for the qwen3-8b decode GEMMs, the LM head and gate/up with its
#           activation: torch.matmul, the register kernel and the staged kernel in the STAGED configurations
#           (KC:S:PL:C), weights from DRAM; with ENGINE set, then the engine mode with those variants
#   engine: the engine A/B in one process (profile_decode.py, the STAGED variants against the default) at
#           qwen3-8b batch 1 and 8 with the batch-1 graph timeline, then qwen3-0.6b batch 1 and 8
#   engine06: the same at qwen3-0.6b batch 1 and 8 (V06: its variants, also after the engine mode)
#   checks: with the staged kernel the default, check_kernels.py --only staged skinny epilogue, the engine smoke
#           test, the qwen3-0.6b A/B of the default against o_proj fetching nothing early and the staged kernel
#           off, then the GPU-scale qwen3-8b conformance clauses beside conformance at CI scale
#   final:  the engine decode bench (its transformers peer included; SMOKE=1: after the engine smoke test)
source benches/gpu/_env.sh
mode=${1:-probe}
shift
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
if [ "$mode" = probe ]; then
  checks 200 check_kernels_staged.log ${CHECKS:-staged skinny epilogue}
  grep -E "FAIL" "$OUT/check_kernels_staged.log" | head -12
  timeout 240 python3 benches/gpu/probe_blas.py --reps 20 --no-lt --swiglu \
    --staged ${STAGED:-512:4:16:2 1024:3:16:2 1024:4:16:1 2048:2:16:1 2048:3:16:1} \
    > "$OUT/probe_staged.log" 2>&1
  echo "probe rc=$?"; cat "$OUT/probe_staged.log"
  timeout 120 python3 benches/gpu/trace_staged.py --configs 2048:2:16:1 1024:3:16:2 --ms 1 > "$OUT/trace_staged.log" 2>&1
  echo "trace rc=$?"; grep -v "latest CTAs" "$OUT/trace_staged.log"
  [ -n "$ENGINE" ] && mode=engine && set -- $ENGINE
fi
if [ "$mode" = engine ]; then
  variants=${*:-default st-gu st-big st-all st6-all}
  timeout 420 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 1 8 --profile-batches \
    --timeline-batches 1 --rounds 3 --variants $variants > "$OUT/profile_staged_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -vE "^\s+[0-9]+x" "$OUT/profile_staged_8b.log"
  grep -E "^\s+[0-9]+x" "$OUT/profile_staged_8b.log" | cut -c1-110
fi
if [ "$mode" = engine06 ] || [ -n "$V06" ]; then
  variants=${V06:-${*:-default st-all st-big}}
  timeout 200 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 1 8 --profile-batches \
    --rounds 3 --variants $variants > "$OUT/profile_staged_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -vE "^\s+[0-9]+x" "$OUT/profile_staged_06b.log"
fi
if [ "$mode" = checks ]; then
  checks 200 check_kernels_staged_final.log staged skinny epilogue
  smoke 100
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 1 8 --profile-batches \
    --rounds 3 --variants default st1k-all no-staged > "$OUT/profile_staged_06b_default.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -vE "^\s+[0-9]+x" "$OUT/profile_staged_06b_default.log"
  conformance_gpu 280 qwen3-8b conformance_gpu_qwen3-8b_staged.log > "$OUT/c8.summary" &
  conformance_ci 300
  wait
  cat "$OUT/c8.summary"; rm -f "$OUT/c8.summary"
fi
if [ "$mode" = final ]; then
  [ -n "$SMOKE" ] && smoke 100
  run_benches 300 "engine_decode"
  pack_bench
fi
