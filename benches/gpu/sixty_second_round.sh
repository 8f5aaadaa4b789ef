#!/usr/bin/env bash
# The sixty-second session's device calls (run from the repository root, any H100 or H200): skinny_wg.cu's stage
# loop without the warpgroup wait ptxas had injected at its back edge (advisory C7517; docs/performance/decode_step.md,
# "The MMA phase alone, and the wait ptxas injected"), against the loop of 621be9e.
#   git show 621be9e:optimized/kernels/skinny_wg.cu > benches/gpu/base_skinny_wg.cu   # the base (left untracked)
#   bash benches/gpu/sixty_second_round.sh a    # the kernel checks of the build (wg, wg-norm); the MMA probe (with
#                       # wait0: each stage's group waited on); the A/B of the build against the base, qwen3-0.6b
#                       # batch 32 and 64, one process of each
#   bash benches/gpu/sixty_second_round.sh b    # the A/B's second pair of processes, then the per-CTA trace of the
#                       # build at batch 32, with the stages' landings
#   bash benches/gpu/sixty_second_round.sh final  # the engine decode bench against transformers and the qwen3-0.6b
#                       # conformance clauses at GPU scale, of the tree as copied
#   bash benches/gpu/sixty_second_round.sh exit   # (no base file needed) the split-K kernels' last cluster barrier
#                       # without .release, the build, against TK_WG_RELEASE_EXIT's barrier with it: the kernel checks
#                       # of the build, the A/B (qwen3-0.6b batch 32 and 64, two processes of each, alternated;
#                       # qwen3-8b one each), and the build's per-CTA trace at batch 32. The session ran the checks and
#                       # the qwen3-0.6b A/B in one call of its own, on the tree where the relaxed barrier was the
#                       # switch TK_WG_RELAXED_EXIT (the same two kernels, named the other way round); the whole mode,
#                       # and final, ran in the sixty-third session (benches/results/h100/sixty_third_session/)
# (The session's runs wrapped profile_decode.py in an inline Python heredoc that did what run_with.py does; the
# helper replaced it after the runs.)
source benches/gpu/_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
BASE=benches/gpu/base_skinny_wg.cu
date +%T; build_kernels; date +%T
if [ "${1:-a}" = final ]; then
  run_benches 240 "engine_decode and 0.6b"
  grep -E "^\| qwen3-[0-9.]+b \| (1|32|64) \|" "$OUT/bench/engine_decode.md" | cut -c1-110
  mv "$OUT/bench/run_gpu.log" "$OUT/run_gpu_decode.log"; pack_bench; mv "$OUT/bench.tgz" "$OUT/bench_decode.tgz"
  date +%T; conformance_gpu 330 qwen3-0.6b conformance_gpu_qwen3-0.6b.log; date +%T
  exit 0
fi
if [ "$1" = exit ]; then
  RL=(--define TK_WG_RELEASE_EXIT)
  checks 150 check_kernels_relaxed.log wg-norm wg; date +%T
  profile_with relaxed_1 qwen3-0.6b; profile_with release_1 qwen3-0.6b "${RL[@]}"
  profile_with relaxed_2 qwen3-0.6b; profile_with release_2 qwen3-0.6b "${RL[@]}"
  date +%T; profile_with relaxed_8b qwen3-8b; profile_with release_8b qwen3-8b "${RL[@]}"; date +%T
  timeout 150 python3 benches/gpu/trace_wg.py --batch 32 --variants spread > "$OUT/trace_wg_relaxed_b32.log" 2>&1
  echo "trace_wg rc=$?"; grep -v Warning "$OUT/trace_wg_relaxed_b32.log"; date +%T; exit 0
fi
[ -f "$BASE" ] || { echo "no $BASE: see this script's head"; exit 1; }
if [ "${1:-a}" = a ]; then
  checks 150 check_kernels.log wg-norm wg; date +%T
  timeout 120 python3 benches/gpu/probe_mma.py > "$OUT/probe_mma.log" 2>&1; echo "probe_mma rc=$?"
  grep -v Warning "$OUT/probe_mma.log"; date +%T
  profile_with new_1 qwen3-0.6b; date +%T; profile_with base_1 qwen3-0.6b --skinny-wg-source "$BASE"; date +%T
else
  profile_with new_2 qwen3-0.6b; profile_with base_2 qwen3-0.6b --skinny-wg-source "$BASE"; date +%T
  timeout 150 python3 benches/gpu/trace_wg.py --batch 32 --variants spread > "$OUT/trace_wg_b32.log" 2>&1
  echo "trace_wg rc=$?"; grep -v Warning "$OUT/trace_wg_b32.log"; date +%T
fi
exit 0
