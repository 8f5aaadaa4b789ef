"""turnkv optimized engine: our CUDA kernels through CuPy, torch GEMMs and CUDA graphs, bf16.

Importing this package needs neither CuPy nor a GPU; constructing ``Engine`` without them
raises ``DeviceUnavailableError``.
"""

from reference import SamplingParams, Trajectory, TurnOutput  # the shared types

from .engine import Engine, require_cuda

__version__ = "0.1.0"
__all__ = ["Engine", "SamplingParams", "TurnOutput", "Trajectory", "require_cuda", "__version__"]
