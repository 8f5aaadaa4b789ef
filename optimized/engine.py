"""The optimized engine: the reference's host side (sequences, block manager, scheduler)
driving ``CudaRunner`` on one GPU, bf16 weights, activations and KV with fp32 accumulation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from reference.config import EngineConfig, ModelConfig, named_config
from reference.engine import EngineCore
from reference.errors import ConfigError, DeviceUnavailableError, OutOfBlocksError
from reference.kv_cache import blocks_for
from reference.runner import StepResult
from reference.scheduler import StepBatch
from reference.types import SamplingParams, TurnOutput
from reference.weights import check_weights, expected_shapes, load_checkpoint, random_tensor

from .lookahead import next_decode

#: defaults that differ from the reference: bf16, a context sized for rollouts, the split-KV size chosen
#: per decode graph from its batch and length buckets (``auto``; docs/decisions.md)
DEFAULTS = {"dtype": "bfloat16", "max_model_len": 8192, "split_kv": "auto"}
#: the split-KV default of batch-invariant mode, which forbids ``auto``
INVARIANT_SPLIT_KV = "fixed:256"


def engine_config(**kwargs: Any) -> EngineConfig:
    """``EngineConfig`` with the optimized engine's defaults under ``kwargs``; with ``batch_invariant=True``
    and no ``split_kv`` given, the split default is ``INVARIANT_SPLIT_KV``."""
    cfg = {**DEFAULTS, **kwargs}
    if cfg.get("batch_invariant") and "split_kv" not in kwargs:
        cfg["split_kv"] = INVARIANT_SPLIT_KV
    return EngineConfig(**cfg)


def require_cuda(device: str | torch.device) -> torch.device:
    """The one clear error when CuPy or a CUDA GPU is missing."""
    try:
        import cupy  # noqa: F401
    except ImportError as e:
        raise DeviceUnavailableError("the optimized engine needs CuPy: pip install 'turnkv[cuda12]' or "
                                     f"'turnkv[cuda13]' ({e})") from None
    if not torch.cuda.is_available():
        raise DeviceUnavailableError("the optimized engine needs a CUDA GPU, and torch sees none")
    dev = torch.device(device)
    if dev.type != "cuda":
        raise DeviceUnavailableError(f"the optimized engine runs on a CUDA device, got {device!r}")
    return dev


def shape_problems(cfg: ModelConfig, block_size: int) -> list[str]:
    """Model shapes the CUDA kernels are not built for (empty: supported). Needs no GPU."""
    from .ops import ATTN_HEAD_DIMS
    problems = []
    if cfg.head_dim not in ATTN_HEAD_DIMS:
        problems.append(f"head_dim {cfg.head_dim} (kernels exist for {ATTN_HEAD_DIMS})")
    if cfg.hidden_size % 8 or cfg.intermediate_size % 8:
        problems.append("hidden_size and intermediate_size must be multiples of 8")
    return problems


def check_supported(cfg: ModelConfig, ecfg: EngineConfig) -> None:
    """The shapes and options the optimized engine is built for; anything else is a typed ``ConfigError``."""
    problems = shape_problems(cfg, ecfg.block_size)
    if problems:
        raise ConfigError("the optimized engine does not support " + "; ".join(problems))


def score_in_pool(engine: EngineCore, ids: list[int]) -> torch.Tensor:
    """Teacher-forced logits through the paged prefill path, in pages borrowed from the pool for the call."""
    n = blocks_for(len(ids), engine.config.block_size)
    if n > engine.blocks.num_free:
        raise OutOfBlocksError(f"score needs {n} free blocks, {engine.blocks.num_free} are free")
    table: list[int] = []
    engine.blocks.grow(table, len(ids))
    try:
        return engine.runner.score(ids, table)
    finally:
        engine.blocks.free(table)


class Engine(EngineCore):
    """Same public interface as ``reference.Engine``; bf16 on a CUDA GPU."""

    name = "optimized"

    def __init__(self, model_cfg: ModelConfig, weights: dict[str, torch.Tensor] | None,
                 engine_cfg: EngineConfig | None = None, device: str = "cuda:0", use_graphs: bool = True,
                 seed: int = 0) -> None:
        dev = require_cuda(device)
        engine_cfg = engine_cfg or engine_config()
        if engine_cfg.dtype != "bfloat16":
            raise ConfigError("the optimized engine computes in bfloat16; pass dtype='bfloat16'")
        check_supported(model_cfg, engine_cfg)
        super().__init__(model_cfg, engine_cfg)
        torch.cuda.set_device(dev)
        self.device = str(dev)
        self.dtype = torch.bfloat16
        if weights is None:   # seeded random weights, drawn on the CPU one tensor at a time
            weights = {n: random_tensor(n, s, seed).to(dtype=torch.bfloat16) for n, s in expected_shapes(model_cfg).items()}
        check_weights(model_cfg, weights)
        from .kernels_api import OptimizedKernels
        from .runner import CudaRunner
        self.runner = CudaRunner(model_cfg, engine_cfg, weights, dev, self.num_blocks, self.max_model_len,
                                 self.policy, use_graphs=use_graphs)
        self.kernels = OptimizedKernels(dev)

    @staticmethod
    def _config(kwargs: dict[str, Any]) -> EngineConfig:
        return engine_config(**kwargs)

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, *, seed: int = 0, device: str = "cuda:0",
                        use_graphs: bool = True, **engine_kwargs: Any) -> "Engine":
        """A named config with seeded random weights (the reference's, in bf16), or a checkpoint directory."""
        path = Path(str(name_or_path))
        if path.is_dir():
            cfg, weights = load_checkpoint(path)
        else:
            cfg, weights = named_config(str(name_or_path)), None
        return cls(cfg, weights, cls._config(engine_kwargs), device=device, use_graphs=use_graphs, seed=seed)

    @classmethod
    def from_state_dict(cls, cfg: ModelConfig, weights: dict[str, torch.Tensor], *, device: str = "cuda:0",
                        use_graphs: bool = True, **engine_kwargs: Any) -> "Engine":
        return cls(cfg, weights, cls._config(engine_kwargs), device=device, use_graphs=use_graphs)

    def _load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.runner.load_weights(weights)

    @torch.no_grad()
    def _execute(self, batch: StepBatch) -> StepResult:
        ahead = next_decode(self, batch) if self.runner.wants_lookahead() else None
        return self.runner.execute(batch, ahead)

    # A lookahead step (optimized/lookahead.py) lives inside one run loop: none is left when it returns.
    def rollout_run_turns(self, max_steps: int | None = None) -> dict[int, TurnOutput]:
        try:
            return super().rollout_run_turns(max_steps)
        finally:
            self.runner.drop_lookahead()

    def generate(self, prompts: Any, sp: SamplingParams | None = None) -> list[list[int]]:
        try:
            return super().generate(prompts, sp)
        finally:
            self.runner.drop_lookahead()

    def _score(self, ids: list[int]) -> torch.Tensor:
        return score_in_pool(self, ids)
