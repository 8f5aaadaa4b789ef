#!/usr/bin/env bash
# Thirty-sixth session: the wide kernel of the batch-invariant GEMM copies its first stages' weights before its PDL
# wait, and the invariant gate/up GEMM has a SwiGLU epilogue (docs/performance/batch_invariant.md, "The wide kernel's
# launches"). Device calls, from the repository root:
#   PART=check bash benches/gpu/h200_invariant_epilogue_round.sh   # checks and smoke, the A/B, the overhead bench
#   PART=conf bash benches/gpu/h200_invariant_epilogue_round.sh    # the GPU-scale conformance clauses
#   PART=final bash benches/gpu/h200_invariant_epilogue_round.sh   # the clauses beside the checks and smoke, then check's
#                                                                   # timed part
# check: side by side and untimed, check_kernels.py's gemm, gemm_swiglu and invariant sections and the engine smoke
# test; then, alone on the GPU, ab_invariant.py (the variants in one process, tokens compared; MODELS, BATCHES,
# AB_ARGS: more of its arguments) and
# the invariant_overhead bench (reports in bench_invariant.tgz). conf: the GPU-scale clauses of batch-invariant mode
# (INVARIANT, TURN, SAMPLE) at the qwen3-0.6b shape (FILTER overrides the -k expression). TAG: the logs' suffix.
source benches/gpu/_env.sh
tag=${TAG:-_epi}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
part=${PART:-check}
if [ "$part" = check ] || [ "$part" = final ]; then
  [ "$part" = final ] && ( conformance_gpu "${CONF_SECS:-200}" "${FILTER:-invariant}" "conformance_gpu$tag.log" ) \
    > "$OUT/conf.summary" &
  checks_beside_smoke "${CHECK_SECS:-240}" 200 "$tag" ${SECTIONS:-gemm gemm_swiglu invariant}
  [ -f "$OUT/conf.summary" ] && cat "$OUT/conf.summary" && rm -f "$OUT/conf.summary"
  timeout "${AB_SECS:-200}" python3 benches/gpu/ab_invariant.py --models ${MODELS:-qwen3-0.6b qwen3-8b} \
    --batches ${BATCHES:-1 8 32 64} --steps 32 --rounds 3 --out "$OUT" ${AB_ARGS:-} > "$OUT/ab_invariant$tag.log" 2>&1
  echo "ab_invariant rc=$?"; grep -vE "^\s+[0-9.]+ us" "$OUT/ab_invariant$tag.log" | tail -40
  mv "$OUT/ab_invariant.json" "$OUT/ab_invariant$tag.json" 2>/dev/null
  [ "${BENCH:-1}" = 1 ] && bench_packed 150 "invariant_overhead" "run_gpu_invariant$tag.log" && \
    mv "$OUT/bench.tgz" "$OUT/bench_invariant$tag.tgz"
fi
if [ "$part" = conf ]; then
  conformance_gpu "${CONF_SECS:-330}" "${FILTER:-qwen3-0.6b and (invariant or turn or sample)}" \
    "conformance_gpu_qwen3-0.6b$tag.log"
fi
exit 0
