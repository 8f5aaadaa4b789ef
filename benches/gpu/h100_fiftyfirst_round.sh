#!/usr/bin/env bash
# After the fifty-first session (run from the repository root, any H100 or H200). That session's runs of
# profile_agentic_peer.py showed the agentic bench's transformers peer bound by its host, and a turn's first run in a
# process twice the wall time of a repeat with the same kernels; these tell what a new shape costs it:
#   bash benches/gpu/h100_fiftyfirst_round.sh peer   # the peer's turn 1, twice, with torch's SDPA choice
#                                                     # (its kernels by GPU time name the backend), then with every
#                                                     # backend but cuDNN's: if cuDNN's per-shape setup is the first
#                                                     # run's cost, the second form's first runs are as fast as repeats
source benches/gpu/_env.sh
mode=${1:-peer}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
date +%T
if [ "$mode" = peer ]; then
  timeout 240 python3 benches/gpu/profile_agentic_peer.py --turns 1 --rounds 2 > "$OUT/profile_agentic_peer.log" 2>&1
  echo "peer, torch's SDPA choice rc=$?"; grep -v USDT "$OUT/profile_agentic_peer.log" | grep -E "^\||^ +[0-9]|host CPU"
  date +%T
  timeout 240 python3 benches/gpu/profile_agentic_peer.py --turns 1 --rounds 2 \
    --sdpa flash_attention,efficient_attention,math > "$OUT/profile_agentic_peer_no_cudnn.log" 2>&1
  echo "peer, no cuDNN SDPA rc=$?"; grep -v USDT "$OUT/profile_agentic_peer_no_cudnn.log" | grep -E "^\||^ +[0-9]|host CPU"
fi
date +%T
exit 0
