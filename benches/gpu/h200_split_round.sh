#!/usr/bin/env bash
# The eighth session's rounds on the H200 (logs under $OUT): the `auto` split rule of split-KV decode, and
# kernel variants measured and dropped (commit 8bf03ec has the variants `pf` / `pf_s3` of the `rule` call;
# the `sweep` call ran `m3` (3 CTAs per SM) and `s3` (three stages) instead).
#   bash benches/gpu/h200_split_round.sh sweep   # the sampling + graph checks with timings (the radix_search
#       refactor of the seventh session), the split-KV checks (then: every variant bitwise equal to the base kernel),
#       the engine smoke test, and probe_kernels' `splits` sweep (batch x context x split count x variant,
#       $OUT/splits.json)
#   bash benches/gpu/h200_split_round.sh rule    # the split-KV checks (then: the page-prefetch variants bitwise
#       equal to the base kernel), the `splits` sweep again (then: variants base / pf / pf_s3), the decode kernel lab with
#       the new `auto` rule (packed into $OUT/bench.tgz), and profile_decode's engine A/B of the new rule
#       against the seventh session's (`auto-7`) at qwen3-8b, 4096-token prompts, batch 4 / 8 / 16 / 32
#   bash benches/gpu/h200_split_round.sh ncu     # Nsight Compute on split_kv_partials_d128 (speed of light, warp
#       states, memory, occupancy, scheduler) at batch x context x split 1x300x128 (a batch-1 engine step),
#       1x16384 in one split and in 1024-key splits, 8x4096x1024 and 32x1024 in one split ($OUT/ncu_decode_*.txt)
#   bash benches/gpu/h200_split_round.sh bulk    # (run on commit b842508, whose `bulk` variant copied K/V rows
#       with cp.async.bulk) the split-KV checks (the variant bitwise equal to the base kernel), the `splits`
#       sweep (variants base / bulk), and Nsight Compute on both variants at 1x16384 in one split and
#       8x4096x1024 ($OUT/ncu_decode_*_{base,bulk}.txt); on later trees it profiles the base kernel twice
#   bash benches/gpu/h200_split_round.sh final1  # the split-KV checks, the engine smoke test, conformance at CI
#       scale, the decode kernel lab (packed into $OUT/bench.tgz), and profile_decode's A/B of the engine's split
#       rule and launch mode against the seventh session's (`auto-7`: its rule, two launches past 16 rows) at
#       qwen3-0.6b batch 64 and qwen3-8b batch 32, 1024-token prompts
#   bash benches/gpu/h200_split_round.sh final2  # the engine_decode and agentic benches (their report folders
#       bench_decode/ and bench_agentic/ packed into $OUT/bench.tgz)
#   bash benches/gpu/h200_split_round.sh verify  # the qwen3-0.6b GPU-scale conformance clauses of turns,
#       sampling, memory, state and invariance, then every kernel check
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"

# checks SECONDS LOG SECTIONS...: check_kernels.py on some sections, its failures and its summary
checks() {
  local secs=$1 log=$2; shift 2
  timeout "$secs" python3 benches/gpu/check_kernels.py --only "$@" > "$OUT/$log" 2>&1; echo "check_kernels $* rc=$?"
  grep -E "FAIL" "$OUT/$log" | head -20; tail -1 "$OUT/$log"
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
build_kernels
case "${1:-sweep}" in
sweep)
  checks 100 check_kernels_sampling.log sampling graph --time
  grep -E "^sample B=1 |^sample B=64 " "$OUT"/check_kernels_sampling.log
  checks 120 check_kernels_decode.log splitkv fused fused_rope
  smoke 100
  timeout 300 python3 benches/gpu/probe_kernels.py --only splits --reps 20 --out "$OUT" > "$OUT"/probe_splits.log 2>&1
  echo "splits rc=$?"; grep -o "splits B=[0-9]* ctx=[0-9]*\|best .*" "$OUT"/probe_splits.log | paste - - | head -45
  ;;
rule)
  checks 120 check_kernels_decode.log splitkv fused fused_rope
  timeout 200 python3 benches/gpu/probe_kernels.py --only splits --reps 20 --out "$OUT" > "$OUT"/probe_splits.log 2>&1
  echo "splits rc=$?"; grep -o "splits B=[0-9]* ctx=[0-9]*\|best .*" "$OUT"/probe_splits.log | paste - - | head -45
  run_benches 200 "kernel_decode"
  grep -E "turnkv auto|sdpa cudnn|copy" "$OUT/bench/kernel_decode.md" | cut -d'|' -f2-7,10 | head -40
  pack_bench
  timeout 200 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 4 8 16 32 --prompt 4096 \
    --profile-batches --variants default auto-7 --rounds 3 --out "$OUT" > "$OUT"/profile_split_rule.log 2>&1
  echo "profile rc=$?"; grep -v "^     " "$OUT"/profile_split_rule.log | grep -v "Warn\|_warn" | tail -12
  ;;
ncu)
  for prob in 1,300,128 1,16384,16384 1,16384,1024 8,4096,1024 32,1024,1024; do
    timeout 100 ncu --clock-control none -k regex:split_kv_partials_d128 --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
      --section SchedulerStats --section InstructionStats \
      python3 benches/gpu/probe_kernels.py --only decode --reps 3 --decode-problems $prob \
      > "$OUT/ncu_decode_${prob//,/x}.txt" 2>&1
    echo "ncu $prob rc=$?"
    grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Stall|Issued Warp|No Eligible|Registers Per|Executed Ipc A" \
      "$OUT/ncu_decode_${prob//,/x}.txt" | head -24
  done
  ;;
bulk)
  checks 150 check_kernels_decode.log splitkv fused fused_rope
  timeout 200 python3 benches/gpu/probe_kernels.py --only splits --reps 20 --out "$OUT" > "$OUT"/probe_splits.log 2>&1
  echo "splits rc=$?"; grep -o "splits B=[0-9]* ctx=[0-9]*\|best .*" "$OUT"/probe_splits.log | paste - - | head -45
  for v in base bulk; do
    for prob in 1,16384,16384 8,4096,1024; do
      timeout 100 ncu --clock-control none -k regex:split_kv_partials_d128 --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section Occupancy --section InstructionStats \
        python3 benches/gpu/probe_kernels.py --only decode --reps 3 --decode-problems $prob \
        > "$OUT/ncu_decode_${prob//,/x}_$v.txt" 2>&1
      echo "ncu $prob $v rc=$?"
      grep -E "^    Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Issued Instructions  |Warp Cycles Per Issued" \
        "$OUT/ncu_decode_${prob//,/x}_$v.txt" | head -8
    done
  done
  ;;
final1)
  checks 150 check_kernels_decode.log splitkv fused fused_rope
  smoke 100
  conformance_ci 200
  run_benches 120 "kernel_decode"
  grep -E "turnkv auto" "$OUT/bench/kernel_decode.md" | cut -d'|' -f2-7,10 | head -14
  pack_bench
  for mb in "qwen3-0.6b 64" "qwen3-8b 32"; do
    set -- $mb
    timeout 100 python3 benches/gpu/profile_decode.py --models $1 --batches $2 --prompt 1024 --profile-batches \
      --variants default auto-7 --rounds 3 --out "$OUT/profile_$1" > "$OUT/profile_split_rule_$1.log" 2>&1
    echo "profile $1 rc=$?"; grep -v "^     " "$OUT/profile_split_rule_$1.log" | grep -v "Warn\|_warn" | tail -3
  done
  ;;
final2)
  run_benches 280 "engine_decode"
  grep -E "turnkv|: x transformers|% of the memory roofline" "$OUT/bench/engine_decode.md" | head -30
  mv "$OUT/bench" "$OUT/bench_decode"
  run_benches 280 "agentic"
  grep -E "^\| (resume|re-prefill|transformers)" "$OUT/bench/agentic.md" | head -6
  mv "$OUT/bench" "$OUT/bench_agentic"
  tar czf "$OUT/bench.tgz" -C "$OUT" bench_decode bench_agentic && rm -rf "$OUT/bench_decode" "$OUT/bench_agentic"
  ;;
verify)
  timeout 200 python3 -m pytest conformance -q -rs -p no:cacheprovider --engine optimized --durations=8 \
    --conformance-scale gpu --oracle-device cuda -k "qwen3-0.6b and (turn or sample or mem or state or invariant)" \
    > "$OUT"/conformance_gpu_qwen3-0.6b_split_rule.log 2>&1
  echo "conformance qwen3-0.6b rc=$?"; grep -E "CONFORMANCE FAILURE|^FAILED" "$OUT"/conformance_gpu_qwen3-0.6b_split_rule.log | head -8
  tail -1 "$OUT"/conformance_gpu_qwen3-0.6b_split_rule.log
  timeout 210 python3 benches/gpu/check_kernels.py > "$OUT"/check_kernels.log 2>&1; echo "check_kernels rc=$?"
  grep -E "FAIL" "$OUT"/check_kernels.log | head -20; tail -1 "$OUT"/check_kernels.log
  ;;
esac
