// pdl_probe.cu -- the probe kernel of benches/gpu/probe_blas_pdl.py (not part of the engine).
//
// spin_then_copy lets its dependents launch at once (griddepcontrol.launch_dependents), spins for `ns`
// nanoseconds of %globaltimer, then copies n 16-bit elements src -> dst. A kernel behind a programmatic
// edge from it that reads dst without waiting on the grid dependency reads dst's old contents; one that
// waits (griddepcontrol.wait) reads src's.
extern "C" __global__ void spin_then_copy(const unsigned short* __restrict__ src, unsigned short* __restrict__ dst,
                                          int n, unsigned long long ns) {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  } while (t - t0 < ns);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}
