"""Model and engine configuration: named Qwen3 shapes, Hugging Face ``config.json`` parsing, engine knobs."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from .errors import ConfigError
from .types import SplitKVPolicy


@dataclass(slots=True)
class ModelConfig:
    """The shape of a Qwen3 decoder (the subset of Hugging Face's ``Qwen3Config`` that the math uses)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 40960
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = False
    eos_token_id: int | None = None
    name: str = "custom"

    def __post_init__(self) -> None:
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, f) < 1:
                raise ConfigError(f"{f} must be >= 1, got {getattr(self, f)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                              f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for rotate-half RoPE, got {self.head_dim}")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ConfigError("rms_norm_eps and rope_theta must be > 0")

    @property
    def gqa_group(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @staticmethod
    def from_hf_dict(d: dict, name: str = "checkpoint") -> "ModelConfig":
        """Build from a Hugging Face Qwen3 ``config.json`` dictionary."""
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in d]
        if missing:
            raise ConfigError(f"config.json lacks {', '.join(missing)}")
        arch = d.get("model_type", "qwen3")
        if arch != "qwen3":
            raise ConfigError(f"only model_type 'qwen3' is supported, got {arch!r}")
        rope_theta = d.get("rope_theta")
        if rope_theta is None:  # transformers 5 nests it under rope_parameters
            rope_theta = (d.get("rope_parameters") or {}).get("rope_theta", 1_000_000.0)
        eos = d.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        heads = d["num_attention_heads"]
        return ModelConfig(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads", heads),
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            max_position_embeddings=d.get("max_position_embeddings", 40960),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            eos_token_id=eos,
            name=name,
        )

    def to_hf_dict(self) -> dict:
        """A ``config.json`` dictionary that transformers' ``Qwen3Config`` accepts."""
        return {
            "model_type": "qwen3",
            "architectures": ["Qwen3ForCausalLM"],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "use_sliding_window": False,
            "eos_token_id": self.eos_token_id,
        }


def _qwen3(name: str, hidden: int, inter: int, layers: int, heads: int, kv: int, tie: bool) -> ModelConfig:
    return ModelConfig(vocab_size=151936, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv, head_dim=128,
                       max_position_embeddings=40960, tie_word_embeddings=tie, eos_token_id=151645, name=name)


#: Named configs: ``tiny`` is CI-sized with the real structure (GQA 2, head_dim != hidden/heads,
#: 2 layers); the others are the published Qwen3 shapes, with seeded random weights.
NAMED_CONFIGS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                        max_position_embeddings=2048, tie_word_embeddings=False, eos_token_id=2, name="tiny"),
    "qwen3-0.6b": _qwen3("qwen3-0.6b", 1024, 3072, 28, 16, 8, True),
    "qwen3-1.7b": _qwen3("qwen3-1.7b", 2048, 6144, 28, 16, 8, True),
    "qwen3-4b": _qwen3("qwen3-4b", 2560, 9728, 36, 32, 8, True),
    "qwen3-8b": _qwen3("qwen3-8b", 4096, 12288, 36, 32, 8, False),
}


def named_config(name: str) -> ModelConfig:
    if name not in NAMED_CONFIGS:
        raise ConfigError(f"unknown model {name!r}: expected one of {sorted(NAMED_CONFIGS)} or a checkpoint directory")
    c = NAMED_CONFIGS[name]
    return ModelConfig(**{f.name: getattr(c, f.name) for f in fields(ModelConfig)})


def load_hf_config(path: str | Path) -> ModelConfig:
    p = Path(path) / "config.json"
    if not p.is_file():
        raise ConfigError(f"{path} has no config.json")
    return ModelConfig.from_hf_dict(json.loads(p.read_text()), name=Path(path).name)


@dataclass(slots=True)
class EngineConfig:
    """Engine knobs (both engines).

    ``num_blocks=None`` sizes the pool for ``max_num_seqs`` full-length sequences.
    ``max_num_batched_tokens`` is the per-step token budget; longer prompts and observations
    are prefilled in chunks of at most that many tokens. ``prefill_chunking``: ``"even"`` cuts the
    prefill tokens pending at a step into the fewest steps the budget allows, in near-equal shares
    (no small tail step); ``"greedy"`` fills every step to the budget (``reference/scheduler.py``).
    ``batch_invariant`` makes a sequence's logits bitwise independent of its batch mates and of its
    turn split (DESIGN §4 INVARIANT).
    """

    block_size: int = 16
    num_blocks: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    split_kv: str = "fixed:64"
    dtype: str = "float32"
    batch_invariant: bool = False
    rope_in_attention: bool = False     # cache pre-RoPE K; the attention kernels rotate keys as they read them
    swap_space: int = 0                 # pages of host memory for paused sequences' KV (0: recompute instead)
    prefill_chunking: str = "even"      # "even" | "greedy": how a prefill step's budget is set

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ConfigError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.swap_space < 0:
            raise ConfigError(f"swap_space must be >= 0, got {self.swap_space}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ConfigError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.prefill_chunking not in ("even", "greedy"):
            raise ConfigError(f"prefill_chunking must be 'even' or 'greedy', got {self.prefill_chunking!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        policy = SplitKVPolicy.parse(self.split_kv)
        if self.batch_invariant and policy.kind == "auto":
            raise ConfigError("split_kv='auto' picks splits from the batch shape, which batch-invariant mode forbids; "
                              "use 'fixed:N' or 'disabled'")

    @property
    def policy(self) -> SplitKVPolicy:
        return SplitKVPolicy.parse(self.split_kv)
