#!/usr/bin/env bash
# The fifty-fourth session's device calls (run from the repository root, any H100 or H200).
#   bash benches/gpu/h100_fiftyfourth_round.sh verify  # the fifty-third session's final tree: the folded-norm and
#                                                      # elementwise kernel checks beside the qwen3-8b conformance
#                                                      # clauses at GPU scale (decode steps of 17-64 rows, so with the
#                                                      # fold), then qk_norm_rope in the attention launch at any batch
#                                                      # (qk-all) against the default, in one process
source benches/gpu/_env.sh
mode=${1:-verify}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
date +%T; build_kernels; date +%T
if [ "$mode" = verify ]; then
  ( checks 150 check_kernels_final.log wg-norm elementwise ) > "$OUT/checks.summary" &
  conformance_gpu 300 qwen3-8b conformance_gpu_qwen3-8b_fold.log
  wait; cat "$OUT/checks.summary"; rm -f "$OUT/checks.summary"
  date +%T
  timeout 200 python3 benches/gpu/profile_decode.py --models qwen3-0.6b qwen3-8b --batches 32 64 \
    --variants default qk-all --rounds 3 > "$OUT/profile_decode_qkall.log" 2>&1
  echo "profile_decode rc=$?"; grep -v USDT "$OUT/profile_decode_qkall.log" | grep -vi warn | tail -30
fi
date +%T
exit 0
