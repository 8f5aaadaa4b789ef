#!/usr/bin/env bash
# The sixty-third session's device calls (run from the repository root, any H100 or H200). The experiment: skinny_wg.cu's
# SwiGLU epilogue computing a thread's products eight at a time with the division's fast path written out (swiglu.cuh's
# silu_mul_n), against the epilogue of 84ba193 (one product after another, each division waiting on its own range
# check; docs/performance/decode_step.md, "The SwiGLU epilogue's divisions (sixty-third session)"). It was measured and
# not adopted, so it lives in a patch, not in the build:
#   git apply benches/results/h100/sixty_third_session/swiglu_divisions.patch    # the experiment's tree
#   git show 84ba193:optimized/kernels/skinny_wg.cu > benches/gpu/base_skinny_wg.cu   # the base (left untracked)
#   bash benches/gpu/sixty_third_round.sh    # the kernel checks (silu: every bf16 gate bit for bit; wg, wg-norm), the
#                       # A/B of the build against the base (qwen3-0.6b batch 32 and 64, two processes of each,
#                       # alternated; qwen3-8b one each), the per-CTA trace of the build at batch 32
#   bash benches/gpu/sixty_third_round.sh nomath  # what is left of the SwiGLU epilogue without its math: a variant of
#                       # the build whose SwiGLU store writes bf16(gate * up) (wrong results; timing only), traced
#                       # (batch 32) beside the build and the base, and its step against the build's (qwen3-0.6b);
#                       # the silu check once more first
#   (The tree's engine decode bench and qwen3-0.6b conformance clauses ran as `bash benches/gpu/sixty_second_round.sh
#   final`.)
#   bash benches/gpu/sixty_third_round.sh benches # (any tree) the qwen3-8b engine decode bench and the agentic bench
source benches/gpu/_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
BASE=benches/gpu/base_skinny_wg.cu
date +%T; build_kernels; date +%T
if [ "$1" = benches ]; then  # (the call that ran spelled these steps out and printed the table rows too)
  bench_packed 200 "engine_decode and 8b" run_gpu_decode8b.log; mv "$OUT/bench.tgz" "$OUT/bench_decode8b.tgz"
  date +%T; bench_packed 270 agentic run_gpu_agentic.log; mv "$OUT/bench.tgz" "$OUT/bench_agentic.tgz"
  date +%T; exit 0
fi
[ -f "$BASE" ] || { echo "no $BASE: see this script's head"; exit 1; }
if [ "$1" = nomath ]; then
  checks 90 check_kernels_silu.log silu; grep -E "silu /" "$OUT/check_kernels_silu.log" | cut -c60-230
  NOMATH=/tmp/skinny_wg_nomath.cu
  python3 - "$NOMATH" <<'PY'
import sys
from pathlib import Path
k = Path("optimized/kernels")
head = (k / "skinny.cuh").read_text()
call = "silu_mul_n<8>(o, g, up);"
assert head.count(call) == 1, "the build's SwiGLU store"
head = head.replace(call, "for (int i = 0; i < 8; ++i) o[i] = __fmul_rn(g[i], up[i]);  // no silu: timing only")
text = (k / "skinny_wg.cu").read_text()
assert text.count('#include "skinny.cuh"') == 1
Path(sys.argv[1]).write_text(text.replace('#include "skinny.cuh"', head))
PY
  for v in build:optimized/kernels/skinny_wg.cu base:"$BASE" nomath:"$NOMATH"; do
    timeout 150 python3 benches/gpu/trace_wg.py --batch 32 --variants spread --source "${v#*:}" \
      > "$OUT/trace_wg_${v%%:*}_b32.log" 2>&1
    echo "trace_wg ${v%%:*} rc=$?"; grep -E "^ +(role|qkv|o_proj|gate_up|down) +[0-9n]" "$OUT/trace_wg_${v%%:*}_b32.log" | head -5
  done
  date +%T; profile_with nomath qwen3-0.6b --skinny-wg-source "$NOMATH"; profile_with build qwen3-0.6b; date +%T
  exit 0
fi
checks 200 check_kernels.log silu wg-norm wg; grep -E "silu /" "$OUT/check_kernels.log" | cut -c1-160; date +%T
profile_with new_1 qwen3-0.6b; profile_with base_1 qwen3-0.6b --skinny-wg-source "$BASE"
profile_with new_2 qwen3-0.6b; profile_with base_2 qwen3-0.6b --skinny-wg-source "$BASE"
date +%T; profile_with new_8b qwen3-8b; profile_with base_8b qwen3-8b --skinny-wg-source "$BASE"; date +%T
timeout 150 python3 benches/gpu/trace_wg.py --batch 32 --variants spread > "$OUT/trace_wg_b32.log" 2>&1
echo "trace_wg rc=$?"; grep -v Warning "$OUT/trace_wg_b32.log" | head -12; date +%T
exit 0
