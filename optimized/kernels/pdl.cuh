// pdl.cuh -- programmatic dependent launch (PDL, compute capability 9.0+).
//
// ops.py launches every kernel of this package with the launch attribute
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuLaunchKernelEx), which lets a kernel's
// CTAs start while the previous kernel in the stream is still running. What keeps that correct is
// this header, called first in every kernel:
//   * pdl_wait() -- griddepcontrol.wait: the calling thread waits until the previous grid has
//     completed and its memory operations are visible. Every global read of data another kernel
//     writes, and every global write, comes after it. Only work that depends on nothing a kernel
//     writes may come before it (index arithmetic, or skinny_gemm's L2 prefetch of the weights).
//   * pdl_launch_dependents() -- griddepcontrol.launch_dependents: once every CTA of this grid has
//     passed it, the next kernel of the stream may be scheduled. Called right after pdl_wait(), so
//     at most one kernel is ever waiting ahead of the one running (two exceptions: qk_norm_rope's
//     trigger_first, before a split_kv_early_partials that reads before its wait only rows no running
//     kernel writes; and kv_cache.cu's kv_prefetch, which triggers first, reads only the step's block
//     table and lengths, writes nothing, and waits last).
// Without the attribute (TURNKV_PDL=0, or a launch through CuPy) both are no-ops, and below
// compute capability 9.0 they compile to nothing. The order they give is transitive: a kernel
// waits for its predecessor's completion, which itself waited for its own predecessor.
//
// Every `extern "C" __global__` kernel calls pdl_entry() (or, in skinny_gemm.cu, pdl_wait() and
// pdl_launch_dependents() after its prefetch) before touching global memory; tests/test_kernel_sources.py
// checks that this is so. The exception besides skinny_gemm's: attention.cu's split_kv_qk_partials reads
// the step's metadata, norm weights, RoPE tables and the cached K/V rows of its first two tiles but each
// sequence's new one before its wait (data no running kernel writes: the kernel before it has passed its
// own wait, so every earlier writer has completed), and writes nothing before it; so does split_kv_early_partials
// (a decode step's attention after qk_norm_rope's own launch, whose store writes each sequence's new key only).
// kv_cache.cu's kv_prefetch calls pdl_launch_dependents() first and pdl_wait() last (an L2 prefetch of cached pages,
// it writes nothing): the kernel after it still waits, through its wait, for the kernel before it.
#pragma once

namespace {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// the usual entry: wait for the previous kernel, then let the next one be scheduled
__device__ __forceinline__ void pdl_entry() {
  pdl_wait();
  pdl_launch_dependents();
}

}  // namespace
