"""turnkv optimized engine (CuPy kernels, torch GEMMs and CUDA graphs). Work in progress."""
