"""Typed errors shared by every turnkv engine.

Every rejected call raises one of these *before* it changes anything, so the
engine's state after a rejected call is the state before it.
"""

from __future__ import annotations


class TurnKVError(Exception):
    """Base class of every error turnkv raises on purpose."""


class ConfigError(TurnKVError, ValueError):
    """A configuration or sampling parameter is invalid."""


class UnknownSequenceError(TurnKVError, LookupError):
    """The sequence id was never issued by this engine (or was finished and dropped)."""


class SequenceStateError(TurnKVError):
    """The call is not legal in the sequence's current state (e.g. continue on a running sequence)."""


class InvalidTokenError(TurnKVError, ValueError):
    """A token id is outside ``[0, vocab_size)`` or a token list is malformed."""


class ContextLimitError(TurnKVError, ValueError):
    """The tokens would not fit in the model's context (``max_model_len``)."""


class OutOfBlocksError(TurnKVError):
    """The KV block pool cannot hold what was asked, even after evicting paused sequences."""


class BlockTableError(TurnKVError, ValueError):
    """A block table, a sequence length or a query position failed the launch guards."""


class MergeError(TurnKVError, ValueError):
    """Partial attention states cannot be merged (duplicate or mismatched block indices)."""


class DeviceUnavailableError(TurnKVError, RuntimeError):
    """The optimized engine needs CuPy and a CUDA GPU, and one of them is missing."""
