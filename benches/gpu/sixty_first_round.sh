#!/usr/bin/env bash
# The sixty-first session's device calls (run from the repository root, any H100 or H200).
#   bash benches/gpu/sixty_first_round.sh probes   # the cycle-timed x probe (probe_xload.py, with the SM clock and
#                       # %globaltimer's step) and the MMA phase alone (probe_mma.py); run in the sixty-second session
# Its other mode, the A/B of the warpgroup GEMMs' two MMA chains (skinny_wg.cu's build switch TK_WG_TWO_CHAINS;
# docs/performance/decode_step.md, "The edge probe, the x copies and the MMA chain after the wait"), ran on the tree
# of that session. The switch was removed in the sixty-second session, so that mode runs only from
# `git show 621be9e:benches/gpu/sixty_first_round.sh` on a checkout of 621be9e.
source benches/gpu/_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ "${1:-}" = probes ]; then
  timeout 120 python3 benches/gpu/probe_xload.py > "$OUT/probe_xload.log" 2>&1; echo "probe_xload rc=$?"
  grep -v Warning "$OUT/probe_xload.log" | head -40
  timeout 120 python3 benches/gpu/probe_mma.py > "$OUT/probe_mma.log" 2>&1; echo "probe_mma rc=$?"
  grep -v Warning "$OUT/probe_mma.log"
  exit 0
fi
echo "usage: bash benches/gpu/sixty_first_round.sh probes (see its head)"; exit 2
