"""Everything a failure's repro snippet needs: ``from conformance.repro import *``."""

import torch  # noqa: F401

from reference import PartialState, SamplingParams  # noqa: F401
from reference.errors import *  # noqa: F401,F403

from .cases import (KVSpec, PrefillSpec, build_kv, build_prefill, build_queries, engine_defaults,  # noqa: F401
                    make_weights, model_config)
from .engines import EngineLoadError, resolve  # noqa: F401


def build_engine(spec: str, cfg, weights, **engine_kwargs):
    """``--engine`` value -> engine, exactly as the harness builds it."""
    from .engines import build

    name, factory = resolve(spec)
    return build(factory, name, cfg, weights, **engine_kwargs)


def on_kernel(t, eng, floating=True):
    """Move a float32 CPU tensor to the engine's kernel device (and dtype when ``floating``)."""
    from .harness import to_kernel

    return to_kernel(t, eng.kernels, floating)


__all__ = [n for n in dir() if not n.startswith("_")]
