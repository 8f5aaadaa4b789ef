#!/usr/bin/env bash
# Eighteenth session's device calls on the decode step's fixed costs (run from the repository root):
#   bash benches/gpu/h200_copies_stream_round.sh MODE
#   ab:     check_kernels.py --only elementwise graph (embed_rmsnorm bitwise embedding + rmsnorm; graph capture),
#           the engine smoke test, then the engine A/B in one process (profile_decode.py): the default (two device
#           slots per decode graph key, the upload and read-back on a copy stream; the embedding and first norm in
#           one launch) against copies-inline and embed-apart at qwen3-8b and qwen3-0.6b batch 1 and 8 (batch-1
#           graph timelines), then qk-all (qk_norm_rope in the attention launch above 16 rows) against the default
#           at batch 32, 64 and 256
#   power:  the 8B A/B of the copy streams again (default against copies-inline, batch 1 and 8, five rounds)
#           with nvidia-smi sampling power, clocks and the clock-event reasons every 100 ms beside it, then
#           check_kernels.py (CHECKS), the engine smoke test, conformance at CI scale beside the GPU-scale
#           qwen3-8b clauses
#   bench:  the engine decode bench (its transformers peer included)
#   waves:  the staged GEMM at 3 CTAs a multiprocessor (512-column chunks, 4 stages) for qwen3-8b's qkv and
#           qwen3-0.6b's gate/up (384 tiles: about 1.45 waves of 264 CTAs) against the default, batch 1 and 8
#   final:  (qkv on the 3-CTA configuration) check_kernels.py (CHECKS: staged at 1-3 CTAs a multiprocessor too),
#           the engine smoke test, conformance at CI scale beside the GPU-scale qwen3-8b clauses, the engine bench
#   more:   o_proj or down at 3 CTAs a multiprocessor too (o3, d3), qkv back at 2 (qkv2), qwen3-0.6b's gate/up at 3
#           with qkv (qkv3-gu3), against the default; then the engine decode bench again
#   wave:   (gate/up on qkv's configuration where its tiles fit one wave of it) the rule off (gu-wave0) and qkv's
#           early stages 1, 3, 4 (of 4) against the default; the engine smoke test; the engine decode bench
#   stages: qkv at 3 CTAs a multiprocessor with 3 or 2 stages (qkv-s3, qkv-s2) against the default; if one is
#           faster at all four points, STAGED_QKV takes it (on the device copy) and the smoke test and bench run
source benches/gpu/_env.sh
mode=${1:-ab}
shift
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
build_kernels
if [ "$mode" = ab ]; then
  checks 120 check_kernels_embed.log ${CHECKS:-elementwise graph}
  smoke 80
  timeout 200 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 1 8 --profile-batches \
    --timeline-batches 1 --rounds 3 --variants ${V8:-default copies-inline embed-apart} > "$OUT/profile_copies_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -vE "^\s+[0-9]+x" "$OUT/profile_copies_8b.log" | grep -v Warn
  grep -E "^\s+[0-9]+x" "$OUT/profile_copies_8b.log" | cut -c1-110 | head -30
  timeout 100 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 1 8 --profile-batches \
    --timeline-batches 1 --rounds 3 --variants ${V06:-default copies-inline embed-apart} > "$OUT/profile_copies_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+[18] +|graph timeline" "$OUT/profile_copies_06b.log" | cut -c1-160
  timeout 180 python3 benches/gpu/profile_decode.py --models qwen3-0.6b qwen3-8b --batches 32 64 256 --profile-batches \
    --rounds 3 --variants default qk-all > "$OUT/profile_qkrows.log" 2>&1
  echo "profile qk rows rc=$?"; grep -E "^ +[0-9]+ +(default|qk-all)|==" "$OUT/profile_qkrows.log"
fi
if [ "$mode" = power ]; then
  q=timestamp,power.draw,power.limit,clocks.sm,clocks.mem,temperature.gpu,clocks_event_reasons.active
  nvidia-smi --query-gpu=$q --format=csv -lms 100 > "$OUT/smi_power.csv" 2>&1 &
  smi=$!
  timeout 200 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 1 8 --profile-batches \
    --rounds 5 --variants default copies-inline > "$OUT/profile_copies_power_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -E "^\s+[18] +" "$OUT/profile_copies_power_8b.log"
  kill $smi
  head -3 "$OUT/smi_power.csv"
  python3 - "$OUT/smi_power.csv" <<'PY'
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))[1:]
rows = [[c.strip() for c in r] for r in rows if len(r) >= 7]
busy = [r for r in rows if float(r[1].split()[0]) > 200]
print(f"{len(rows)} samples, {len(busy)} above 200 W")
for name, col in (("power W", 1), ("sm MHz", 3), ("mem MHz", 4), ("temp C", 5)):
    v = sorted(float(r[col].split()[0]) for r in busy) or [0]
    print(f"  {name}: median {v[len(v) // 2]:.0f}, p10 {v[len(v) // 10]:.0f}, p90 {v[9 * len(v) // 10]:.0f}, max {v[-1]:.0f}")
print("  clock-event reasons (busy samples):", dict(collections.Counter(r[6] for r in busy)))
PY
  checks 200 check_kernels_final.log ${CHECKS:-elementwise qk fused graph}
  smoke 80
  conformance_both 200 conformance_gpu_qwen3-8b_final.log 250
fi
if [ "$mode" = bench ]; then
  run_benches 300 "engine_decode"
  pack_bench
fi
if [ "$mode" = waves ]; then
  # the staged GEMM at 3 CTAs a multiprocessor for the roles of about 1.45 waves (profile_decode.py's STAGED)
  timeout 220 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 1 8 --profile-batches \
    --timeline-batches 1 --rounds 3 --variants default qkv3 qkv-k512 gu3 qkv3-gu3 > "$OUT/profile_waves_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -E "^\s+[18] +" "$OUT/profile_waves_8b.log"
  grep -E "graph timeline|\[qkv\]|swiglu|\[o_proj\]|\[down\]" "$OUT/profile_waves_8b.log" | cut -c1-120
  timeout 120 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 1 8 --profile-batches \
    --rounds 3 --variants default qkv3 gu3 qkv3-gu3 > "$OUT/profile_waves_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+[18] +" "$OUT/profile_waves_06b.log"
fi
if [ "$mode" = final ]; then
  checks 200 check_kernels_final_staged.log ${CHECKS:-staged elementwise graph}
  smoke 80
  conformance_both 150 conformance_gpu_qwen3-8b_final.log 200
  run_benches 200 "engine_decode"
  pack_bench
fi
if [ "$mode" = more ]; then
  # (qkv at 3 CTAs a SM, the default) o_proj / down there too, qkv back at 2 (qkv2); then the engine bench again
  timeout 150 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 1 8 --profile-batches \
    --timeline-batches 1 --rounds 3 --variants default qkv2 o3 d3 > "$OUT/profile_more_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -E "^\s+[18] +" "$OUT/profile_more_8b.log"
  grep -E "graph timeline|\[qkv\]|\[o_proj\]|\[down\]" "$OUT/profile_more_8b.log" | cut -c1-120
  timeout 100 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 1 8 --profile-batches \
    --rounds 3 --variants default qkv2 qkv3-gu3 o3 d3 > "$OUT/profile_more_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+[18] +" "$OUT/profile_more_06b.log"
  run_benches 200 "engine_decode"
  pack_bench
fi
if [ "$mode" = wave ]; then
  # the one-wave rule for gate/up (qwen3-0.6b) and qkv's early stages, then the smoke test and the engine bench
  timeout 100 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 1 8 --profile-batches \
    --rounds 3 --variants default gu-wave0 qkv-p1 qkv-p3 qkv-p4 > "$OUT/profile_wave_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+[18] +" "$OUT/profile_wave_06b.log"
  timeout 120 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 1 8 --profile-batches \
    --rounds 3 --variants default qkv-p1 qkv-p3 qkv-p4 > "$OUT/profile_wave_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -E "^\s+[18] +" "$OUT/profile_wave_8b.log"
  smoke 80
  run_benches 200 "engine_decode"
  pack_bench
fi
if [ "$mode" = stages ]; then
  # qkv at 3 CTAs a SM with 3 or 2 stages (room for the attention's CTAs during the GEMM); if one is faster than
  # the default at all four points (qwen3-8b and qwen3-0.6b, batch 1 and 8), STAGED_QKV takes it on this copy of
  # the tree and the smoke test and the engine decode bench run on it
  checks 120 check_kernels_stages.log staged
  timeout 120 python3 benches/gpu/profile_decode.py --models qwen3-8b --batches 1 8 --profile-batches \
    --timeline-batches 1 --rounds 3 --variants default qkv-s3 qkv-s2 > "$OUT/profile_stages_8b.log" 2>&1
  echo "profile 8b rc=$?"; grep -E "^\s+[18] +" "$OUT/profile_stages_8b.log"
  grep -E "graph timeline|\[qkv\]|split_kv_qk" "$OUT/profile_stages_8b.log" | cut -c1-120
  timeout 80 python3 benches/gpu/profile_decode.py --models qwen3-0.6b --batches 1 8 --profile-batches \
    --rounds 3 --variants default qkv-s3 qkv-s2 > "$OUT/profile_stages_06b.log" 2>&1
  echo "profile 0.6b rc=$?"; grep -E "^\s+[18] +" "$OUT/profile_stages_06b.log"
  pick=$(python3 - "$OUT/profile_stages_8b.log" "$OUT/profile_stages_06b.log" <<'PY'
import re, sys
t = {}
for f in sys.argv[1:]:
    for line in open(f):
        m = re.match(r"\s+(\d+)\s+(\S+)\s+([\d.]+)\s", line)
        if m:
            t[(f, m[1], m[2])] = float(m[3])
best = None
for v in ("qkv-s3", "qkv-s2"):
    keys = [k for k in t if k[2] == "default"]
    if len(keys) == 4 and all(t.get((f, b, v), 1e9) < t[(f, b, "default")] for f, b, _ in keys):
        gain = sum(t[(f, b, "default")] - t[(f, b, v)] for f, b, _ in keys)
        if gain > 0.02 and (best is None or gain > best[1]):   # more than 20 us over the four points
            best = (v, gain)
print(best[0][-1] if best else "")
PY
)
  if [ -n "$pick" ]; then
    sed -i "s/^STAGED_QKV = (512, 4, 16, 3, 2)/STAGED_QKV = (512, $pick, 16, 3, 2)/" optimized/runner.py
    echo "STAGED_QKV now: $(grep '^STAGED_QKV' optimized/runner.py)"
    smoke 80
    run_benches 200 "engine_decode"
    pack_bench
  else
    echo "no variant faster at all four points: STAGED_QKV kept"
  fi
fi
