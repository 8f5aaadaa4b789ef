#!/usr/bin/env bash
# Thirty-seventh session: where the agentic workload's time goes (docs/performance/agentic.md, "Agentic workload").
# Device call, from the repository root:
#   bash benches/gpu/h200_agentic_round.sh
# profile_agentic.py (the bench's workload, the engine resuming: per turn the GPU's busy and idle time, the prefill
# and decode steps against the decode floor, and the kernels of turns 2 and 8); then, if CANON=1, profile_decode.py's
# canon variants (the default engine's steps of some rows with every GEMM on the batch-invariant kernels; CANON_VARIANTS,
# default canon8 / canon16) at CANON_BATCHES (default 1 8 16) of both models. AGENTIC=0 skips the profile;
# AGENTIC_ARGS: more of profile_agentic.py's arguments (thirty-eighth session: "--cprofile" profiles the resumed turns'
# prefill steps on the host, "--prefill-ab 2" times prefill_chunking even, greedy, and greedy with prefill graphs).
# CHECKS=1 first runs the conformance suite at CI scale beside the engine smoke test (untimed). TAG: the logs' suffix.
source benches/gpu/_env.sh
tag=${TAG:-}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
if [ "${CHECKS:-0}" = 1 ]; then     # untimed, side by side: the conformance suite at CI scale and the engine smoke test
  ( conformance_ci "${CONF_SECS:-330}" ) > "$OUT/conf.summary" &
  ( smoke 240 ) > "$OUT/smoke.summary" &
  wait; cat "$OUT/conf.summary" "$OUT/smoke.summary"; rm -f "$OUT/conf.summary" "$OUT/smoke.summary"
  mv "$OUT/engine_smoke.log" "$OUT/engine_smoke$tag.log"; mv "$OUT/conformance_ci_optimized.log" "$OUT/conformance_ci$tag.log"
fi
if [ "${AGENTIC:-1}" = 1 ]; then
  timeout "${AGENTIC_SECS:-240}" python3 benches/gpu/profile_agentic.py --out "$OUT" ${AGENTIC_ARGS:-} \
    > "$OUT/profile_agentic$tag.log" 2>&1
  echo "profile_agentic rc=$?"; grep -v "^\s*$" "$OUT/profile_agentic$tag.log" | grep -v "^USDT\|Warning" | tail -90
  mv "$OUT/profile_agentic.json" "$OUT/profile_agentic$tag.json" 2>/dev/null
fi
if [ "${CANON:-1}" = 1 ]; then
  timeout "${CANON_SECS:-200}" python3 benches/gpu/profile_decode.py --models qwen3-0.6b qwen3-8b --batches ${CANON_BATCHES:-1 8 16} \
    --steps 32 --rounds 3 --profile-batches --variants default ${CANON_VARIANTS:-canon8 canon16} > "$OUT/profile_canon$tag.log" 2>&1
  echo "profile_decode canon rc=$?"; grep -vE "^\s+[0-9.]+ us|^USDT|Warning" "$OUT/profile_canon$tag.log" | tail -40
fi
exit 0
