"""Engine selection: ``--engine reference | optimized | reference-bf16 | pkg.module:factory``.

An engine factory is ``factory(model: str | ModelConfig, weights: dict | None, **engine_kwargs) -> engine``.
``model`` is a named config or a ``ModelConfig``; ``weights`` are float32 CPU tensors with Hugging Face
names (``None``: the factory draws seeded random weights). The harness always passes the weights it also
gives to the oracles.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform
from typing import Any, Callable

import torch

import reference as _ref
from reference.config import ModelConfig, named_config
from reference.weights import random_weights

from .tolerance import as_dtype

ENV_VAR = "TURNKV_ENGINE"
DEFAULT_ENGINE = "reference"
BUILTIN = {
    "reference": "conformance.engines:reference",
    "reference-bf16": "conformance.engines:reference_bf16",
    "optimized": "conformance.engines:optimized",
}

Factory = Callable[..., Any]


class EngineLoadError(RuntimeError):
    """The ``--engine`` value does not name a factory that builds an engine."""


def _config(model: str | ModelConfig) -> ModelConfig:
    return model if isinstance(model, ModelConfig) else named_config(str(model))


def _weights(cfg: ModelConfig, weights: dict | None) -> dict:
    return weights if weights is not None else random_weights(cfg, 0)


def reference(model: str | ModelConfig, weights: dict | None = None, **engine_kwargs: Any):
    """The pure-PyTorch reference engine (float32 unless ``dtype=`` says otherwise)."""
    cfg = _config(model)
    return _ref.Engine.from_state_dict(cfg, _weights(cfg, weights), **engine_kwargs)


def reference_bf16(model: str | ModelConfig, weights: dict | None = None, **engine_kwargs: Any):
    """The reference engine in bfloat16 (exercises the harness's bf16 tolerance paths on the CPU)."""
    engine_kwargs.setdefault("dtype", "bfloat16")
    return reference(model, weights, **engine_kwargs)


def optimized(model: str | ModelConfig, weights: dict | None = None, **engine_kwargs: Any):
    """``optimized.Engine.from_state_dict(cfg, weights, device="cuda:0", **kw)``, imported lazily."""
    cfg = _config(model)
    try:
        opt = importlib.import_module("optimized")
    except Exception as e:  # noqa: BLE001 - any import failure is a load failure
        raise EngineLoadError(f"--engine optimized: cannot import the 'optimized' package: {type(e).__name__}: {e}") from e
    engine_cls = getattr(opt, "Engine", None)
    if engine_cls is None or not hasattr(engine_cls, "from_state_dict"):
        raise EngineLoadError("--engine optimized: optimized.Engine.from_state_dict does not exist "
                              "(the optimized engine is not built yet?)")
    engine_kwargs.setdefault("device", "cuda:0")
    try:
        return engine_cls.from_state_dict(cfg, _weights(cfg, weights), **engine_kwargs)
    except _ref.DeviceUnavailableError as e:
        raise EngineLoadError(f"--engine optimized: no usable device: {e}") from e


def _optimized_supports(cfg: ModelConfig, **engine_kwargs: Any) -> str | None:
    """Why the optimized engine declines a model shape (``None``: it supports it). Needs no GPU."""
    from optimized.engine import shape_problems
    problems = shape_problems(cfg, int(engine_kwargs.get("block_size", 16)))
    return "; ".join(problems) or None


optimized.supports = _optimized_supports   # type: ignore[attr-defined]


def resolve(spec: str | None) -> tuple[str, Factory]:
    """``(canonical spec, factory)`` for an engine option value (``None``: env var, then ``reference``)."""
    spec = (spec or os.environ.get(ENV_VAR) or DEFAULT_ENGINE).strip()
    target = BUILTIN.get(spec, spec)
    if ":" not in target:
        raise EngineLoadError(f"--engine {spec!r}: expected one of {sorted(BUILTIN)} or 'pkg.module:factory'")
    mod_name, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001
        raise EngineLoadError(f"--engine {spec!r}: cannot import module {mod_name!r}: {type(e).__name__}: {e}") from e
    obj: Any = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise EngineLoadError(f"--engine {spec!r}: module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise EngineLoadError(f"--engine {spec!r}: {target} is not callable")
    return spec, obj


def build(factory: Factory, spec: str, cfg: ModelConfig, weights: dict, **engine_kwargs: Any):
    """Call the factory; wrap any failure in a clear ``EngineLoadError``."""
    try:
        eng = factory(cfg, weights, **engine_kwargs)
    except EngineLoadError:
        raise
    except _ref.ConfigError:
        raise                                          # a rejected engine knob is the engine's answer, not a load failure
    except Exception as e:  # noqa: BLE001
        raise EngineLoadError(f"--engine {spec!r}: the factory failed to build an engine for {cfg.name!r} "
                              f"with {engine_kwargs}: {type(e).__name__}: {e}") from e
    missing = [m for m in ("rollout_add", "rollout_run_turns", "rollout_continue", "rollout_finish", "generate",
                           "score", "state", "snapshot", "block_table", "kernels", "num_free_blocks",
                           "max_model_len", "num_blocks") if not hasattr(eng, m)]
    if missing:
        raise EngineLoadError(f"--engine {spec!r}: the engine lacks {missing} (see reference.protocol.RolloutEngine)")
    return eng


# ---------------------------------------------------------------------------------- introspection

def engine_dtype(eng: Any) -> torch.dtype:
    for obj in (eng, getattr(eng, "kernels", None), getattr(eng, "config", None)):
        d = getattr(obj, "dtype", None)
        if d is not None:
            try:
                return as_dtype(d)
            except ValueError:
                pass
    return torch.float32


def engine_version(eng: Any) -> str:
    v = getattr(eng, "version", None) or getattr(eng, "__version__", None)
    if v:
        return str(v)
    top = type(eng).__module__.split(".")[0]
    try:
        return str(getattr(importlib.import_module(top), "__version__", "unknown"))
    except Exception:  # noqa: BLE001
        return "unknown"


def kernel_device(eng: Any) -> str:
    return str(getattr(eng.kernels, "device", "cpu"))


def kernel_dtype(eng: Any) -> torch.dtype:
    d = getattr(eng.kernels, "dtype", None)
    return as_dtype(d) if d is not None else engine_dtype(eng)


def cupy_version() -> str:
    if importlib.util.find_spec("cupy") is None:
        return "not installed"
    try:
        import cupy  # type: ignore
        try:
            rt = cupy.cuda.runtime.runtimeGetVersion()
            return f"{cupy.__version__} (CUDA runtime {rt // 1000}.{(rt % 1000) // 10})"
        except Exception:  # noqa: BLE001
            return f"{cupy.__version__} (no CUDA runtime)"
    except Exception as e:  # noqa: BLE001
        return f"import failed ({type(e).__name__})"


def describe(spec: str, eng: Any) -> list[str]:
    """The report header lines."""
    cuda = torch.version.cuda or "none (CPU build)"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU visible"
    return [
        f"turnkv conformance: engine {spec!r} -> {type(eng).__module__}.{type(eng).__qualname__} "
        f"(name {getattr(eng, 'name', '?')!r}, version {engine_version(eng)})",
        f"  device {getattr(eng, 'device', '?')}, dtype {str(engine_dtype(eng)).replace('torch.', '')}; "
        f"kernels on {kernel_device(eng)} in {str(kernel_dtype(eng)).replace('torch.', '')}",
        f"  torch {torch.__version__}, CUDA {cuda} ({gpu}), CuPy {cupy_version()}, python {platform.python_version()}",
    ]
