"""Weights: seeded random initialisation and Hugging Face safetensors checkpoints.

Tensor names are Hugging Face's (``model.layers.0.self_attn.q_proj.weight`` ...), so a
``save_pretrained`` directory loads as is and our weights load into ``Qwen3ForCausalLM``.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import torch
from safetensors.torch import load_file

from .config import ModelConfig, load_hf_config, named_config
from .errors import ConfigError


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model needs, with its shape (``lm_head.weight`` absent when tied)."""
    H, D, I, V = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size
    nq, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (H,),
            p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (nq * D, H),
            p + "self_attn.k_proj.weight": (nkv * D, H),
            p + "self_attn.v_proj.weight": (nkv * D, H),
            p + "self_attn.o_proj.weight": (H, nq * D),
            p + "self_attn.q_norm.weight": (D,),
            p + "self_attn.k_norm.weight": (D,),
            p + "mlp.gate_proj.weight": (I, H),
            p + "mlp.up_proj.weight": (I, H),
            p + "mlp.down_proj.weight": (H, I),
        }
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, H)
    return shapes


def random_tensor(name: str, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """One seeded random float32 CPU tensor, drawn from its own generator seeded by ``(seed, name)``.

    Projections are drawn with std ``1/sqrt(fan_in)`` (unit-variance outputs), the embedding
    with std 1, norm weights near 1: a random model whose greedy continuations are varied
    and whose top-1/top-2 logit margins are well above bf16 noise most of the time.
    """
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    w = torch.randn(shape, generator=g)
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * w
    if name == "model.embed_tokens.weight":
        return w
    return w * shape[-1] ** -0.5


def random_weights(cfg: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32,
                   device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Seeded random weights for ``cfg`` (drawn on the CPU, so every engine gets the same model)."""
    return {name: random_tensor(name, shape, seed).to(device=device, dtype=dtype)
            for name, shape in expected_shapes(cfg).items()}


def check_weights(cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> None:
    """Every expected tensor present with its shape (typed ``ConfigError`` otherwise)."""
    for name, shape in expected_shapes(cfg).items():
        if name not in weights:
            raise ConfigError(f"checkpoint lacks {name}")
        if tuple(weights[name].shape) != shape:
            raise ConfigError(f"{name}: shape {tuple(weights[name].shape)}, expected {shape}")


def load_checkpoint(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read a Hugging Face Qwen3 checkpoint directory: ``config.json`` plus ``model.safetensors``
    or several shards listed in ``model.safetensors.index.json``."""
    path = Path(path)
    cfg = load_hf_config(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (path / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{path} holds no *.safetensors")
    missing = [f for f in files if not (path / f).is_file()]
    if missing:
        raise ConfigError(f"{path}: shard(s) listed but absent: {', '.join(missing)}")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            weights |= load_file(str(path / f))
        except Exception as e:   # safetensors raises its own error types on a damaged file
            raise ConfigError(f"{path / f}: cannot read safetensors ({e})") from None
    if cfg.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    check_weights(cfg, weights)
    return cfg, weights


def named_or_checkpoint(name_or_path: str | Path, seed: int = 0) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """A Hugging Face checkpoint directory, or a named config with seeded random weights."""
    path = Path(str(name_or_path))
    if path.is_dir():
        return load_checkpoint(path)
    cfg = named_config(str(name_or_path))
    return cfg, random_weights(cfg, seed)
