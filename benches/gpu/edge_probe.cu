// edge_probe.cu -- the probe kernels of benches/gpu/probe_edge.py (not part of the engine).
//
// One kernel, launched K times in a chain with programmatic stream serialization: launch s adds 1 to n floats
// (buf[s] -> buf[s + 1]) and thread 0 of every CTA records %globaltimer when its wait is passed and at its end.
// MODE says how launch s waits for launch s - 1's stores:
//   0  griddepcontrol.wait: the grid before has completed and its stores are visible (the engine's edge);
//   1  a counter in global memory: every CTA of launch s - 1 adds 1 to flags[s - 1] after its stores (each thread's
//      fence, then one release add a CTA), and thread 0 of each CTA of launch s spins on an acquire load of it
//      until it reaches the grid before's size (launch 0 waits as in 0, for the flags' reset before it);
//   2  no wait at all: the launches' own pace, a floor (its results are wrong wherever it overlaps).
// The launch's dynamic shared memory (the probe's shapes: 0 or 200 KB) is reserved, never touched: it only sets how
// many CTAs share a multiprocessor (a store into it at 0 bytes: the likely cause of the first run's illegal address).
// Every CTA lets its dependents launch once its wait is passed, as the engine's kernels do. in and out are not
// __restrict__: the flag's acquire orders coherent loads, not the read-only path's.

__device__ __forceinline__ unsigned long long edge_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

template <int MODE>
__device__ __forceinline__ void edge_step(const float* in, float* out, int n,
                                          unsigned* flags, int slot, int prev_grid, unsigned long long* marks) {
  if (MODE == 1 && slot > 0) {
    if (threadIdx.x == 0) {
      unsigned v;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(flags + slot - 1) : "memory");
      } while (v < (unsigned)prev_grid);
    }
    __syncthreads();
  } else if (MODE != 2 || slot == 0) {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
  }
  const unsigned long long t_wait = edge_now();
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = in[i] + 1.f;
  if (MODE == 1) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(flags + slot) : "memory");
  }
  if (threadIdx.x == 0) {
    unsigned long long* m = marks + 2 * ((long long)slot * gridDim.x + blockIdx.x);
    m[0] = t_wait;
    m[1] = edge_now();
  }
}

#define EDGE_KERNEL(name, mode)                                                                                   \
  extern "C" __global__ void name(const float* in, float* out, int n, unsigned* flags,                          \
                                  int slot, int prev_grid, unsigned long long* marks) {                          \
    edge_step<mode>(in, out, n, flags, slot, prev_grid, marks);                                                  \
  }
EDGE_KERNEL(edge_pdl, 0)
EDGE_KERNEL(edge_flag, 1)
EDGE_KERNEL(edge_none, 2)
