# Sourced by the benches/gpu/h200_*.sh device scripts (run from the repository root): a pipeline fails
# with its first failing command, logs go to $OUT (the device machine's output folder; benches/results
# elsewhere), Python runs unbuffered on the working tree with one CuPy kernel cache for every step.
set -o pipefail
OUT="${OUT:-benches/results}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" CUPY_CACHE_DIR=/tmp/cupy_cache

# compile (or load from the cache) every kernel once, before any step times anything
build_kernels() {
  python3 -c "import optimized.kernels as k; k.load_all(); print('kernels built')" 2>&1 | tail -3
}

# run_benches SECONDS EXPR: the pytest benches matching EXPR (benches/run_gpu.sh -k EXPR, reports under
# $OUT/bench) and their target lines
run_benches() {
  timeout "$1" bash benches/run_gpu.sh -k "$2" > /dev/null 2>&1
  echo "benches ($2) rc=$?"
  grep -E "\[(MET |miss)\]|passed|failed" "$OUT/bench/run_gpu.log" | tail -10
}

# pack_bench: $OUT/bench's reports into $OUT/bench.tgz (a device call returns only a few files)
pack_bench() {
  tar czf "$OUT/bench.tgz" -C "$OUT/bench" . && rm -rf "$OUT/bench"
}

# smoke SECONDS: the engine smoke test (every section), its verdict lines
smoke() {
  timeout "$1" python3 benches/gpu/engine_smoke.py > "$OUT"/engine_smoke.log 2>&1; echo "engine_smoke rc=$?"
  grep -E "^\[(ok|FAIL)|FAILED|Error|lookahead steps" "$OUT"/engine_smoke.log | head -20
}

# conformance_ci SECONDS: the conformance suite at CI scale on the optimized engine
conformance_ci() {
  timeout "$1" python3 -m pytest conformance -q -rs -p no:cacheprovider --engine optimized --durations=5 \
    > "$OUT"/conformance_ci_optimized.log 2>&1
  echo "conformance ci rc=$?"; grep -E "CONFORMANCE FAILURE|^FAILED" "$OUT"/conformance_ci_optimized.log | head -8
  tail -1 "$OUT"/conformance_ci_optimized.log
}
