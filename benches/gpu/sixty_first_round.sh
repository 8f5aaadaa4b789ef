#!/usr/bin/env bash
# The sixty-first session's device call (run from the repository root, any H100 or H200): the warpgroup GEMMs'
# two MMA chains (skinny_wg.cu's TK_WG_TWO_CHAINS; docs/performance/decode_step.md, "The edge probe, the x copies
# and the MMA chain after the wait").
#   bash benches/gpu/sixty_first_round.sh   # the kernel checks of the two-chain build (wg, wg-norm); the A/B of two
#                       # chains against one (the build), qwen3-0.6b batch 32 and 64, two processes of each,
#                       # alternated; the per-CTA trace at batch 32 of the two-chain build
#   bash benches/gpu/sixty_first_round.sh probes   # not yet run: the cycle-timed x probe (probe_xload.py, with the
#                       # SM clock and %globaltimer's step) and the MMA phase alone (probe_mma.py)
# (The session's run was of the tree where two chains were the build and TK_WG_ONE_CHAIN the switch: the same two
# kernels, named the other way round.)
# (Its runs used an inline Python heredoc that did what run_with.py's --define does; the helper replaced it in
# the sixty-second session.)
source benches/gpu/_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# built SECONDS DEFINE LOG SCRIPT [ARGS...]: python3 SCRIPT ARGS under a timeout, into $OUT/LOG, with the kernel
# sources built with -DDEFINE (as built where DEFINE is empty; run_with.py)
built() {
  local secs=$1 define=$2 log=$3 opt=(); shift 3
  [ -n "$define" ] && opt=(--define "$define")
  timeout "$secs" python3 benches/gpu/run_with.py "${opt[@]}" "$@" > "$OUT/$log" 2>&1
}
# prof TAG [DEFINE]: profile_decode.py at qwen3-0.6b batch 32 and 64 (the default variant) into
# $OUT/profile_decode_TAG.log, built with -DDEFINE where given
prof() {
  built 150 "$2" "profile_decode_$1.log" benches/gpu/profile_decode.py --models qwen3-0.6b --batches 32 64 \
    --profile-batches --variants spread --rounds 3
  echo "profile_decode $1 rc=$?"; grep -E "^ +(32|64) " "$OUT/profile_decode_$1.log"
}
if [ "${1:-chains}" = probes ]; then
  timeout 120 python3 benches/gpu/probe_xload.py > "$OUT/probe_xload.log" 2>&1; echo "probe_xload rc=$?"
  grep -v Warning "$OUT/probe_xload.log" | head -40
  timeout 120 python3 benches/gpu/probe_mma.py > "$OUT/probe_mma.log" 2>&1; echo "probe_mma rc=$?"
  grep -v Warning "$OUT/probe_mma.log"
  exit 0
fi
date +%T; build_kernels; date +%T
built 120 TK_WG_TWO_CHAINS check_kernels.log benches/gpu/check_kernels.py --only wg-norm wg
echo "check_kernels (two chains) rc=$?"; grep -E "FAIL" "$OUT/check_kernels.log" | head; tail -1 "$OUT/check_kernels.log"
date +%T
prof two_1 TK_WG_TWO_CHAINS; prof one_1; prof two_2 TK_WG_TWO_CHAINS; prof one_2; date +%T
built 90 TK_WG_TWO_CHAINS trace_wg_two_b32.log benches/gpu/trace_wg.py --batch 32 --variants spread
echo "trace_wg rc=$?"; grep -v Warning "$OUT/trace_wg_two_b32.log" | head -9; date +%T
exit 0
