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
