"""turnkv reference engine: the executable spec of paused multi-turn rollout, in pure PyTorch."""

from .attention import PartialState
from .config import NAMED_CONFIGS, EngineConfig, ModelConfig, named_config
from .engine import Engine, EngineCore
from .errors import (BlockTableError, ConfigError, ContextLimitError, DeviceUnavailableError, InvalidTokenError,
                     MergeError, OutOfBlocksError, SequenceStateError, TurnKVError, UnknownSequenceError)
from .protocol import RolloutEngine
from .types import SamplingParams, SplitKVPolicy, Trajectory, TurnOutput, TurnSpan

__version__ = "0.1.0"

__all__ = [
    "Engine", "EngineCore", "EngineConfig", "ModelConfig", "NAMED_CONFIGS", "named_config",
    "SamplingParams", "SplitKVPolicy", "TurnOutput", "Trajectory", "TurnSpan", "PartialState", "RolloutEngine",
    "TurnKVError", "ConfigError", "UnknownSequenceError", "SequenceStateError", "InvalidTokenError",
    "ContextLimitError", "OutOfBlocksError", "BlockTableError", "MergeError", "DeviceUnavailableError",
    "__version__",
]
