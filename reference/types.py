"""The data types every engine shares: sampling parameters, turn outputs, trajectories, the split-KV policy."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Literal

from .errors import ConfigError

StopReason = Literal["stop_token", "max_tokens", "context_limit", "aborted"]
LogprobsMode = Literal["raw", "processed"]


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How to sample one sequence.

    ``temperature == 0`` is greedy (argmax, lowest id on ties). ``top_k == 0`` and
    ``top_p == 1.0`` disable those filters. ``max_tokens`` is the budget of *one turn*.
    Randomness is a pure function of ``(seed, absolute position of the sampled token)``.
    ``logprobs_mode``: ``raw`` is the model distribution ``log_softmax(logits)``;
    ``processed`` is the distribution actually sampled from (after temperature, top-k and
    top-p); at temperature 0 ``processed`` equals ``raw``.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 64
    stop_token_ids: tuple[int, ...] = (151645,)
    seed: int = 0
    logprobs: bool = True
    logprobs_mode: LogprobsMode = "raw"

    def __post_init__(self) -> None:
        for name in ("top_k", "max_tokens", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise ConfigError(f"{name} must be an int, got {v!r}")
            object.__setattr__(self, name, int(v))
        for name in ("temperature", "top_p"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise ConfigError(f"{name} must be a number, got {v!r}")
            object.__setattr__(self, name, float(v))
        if not isinstance(self.logprobs, bool):
            raise ConfigError(f"logprobs must be a bool, got {self.logprobs!r}")
        if not (self.temperature >= 0.0) or self.temperature != self.temperature:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 disables), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not (0 <= self.seed < 2**64):
            raise ConfigError(f"seed must be in [0, 2**64), got {self.seed}")
        if self.logprobs_mode not in ("raw", "processed"):
            raise ConfigError(f"logprobs_mode must be 'raw' or 'processed', got {self.logprobs_mode!r}")
        try:
            stops = tuple(self.stop_token_ids)
        except TypeError:
            raise ConfigError(f"stop_token_ids must be a sequence of ints, got {self.stop_token_ids!r}") from None
        if any(isinstance(t, bool) or not isinstance(t, numbers.Integral) for t in stops):
            raise ConfigError(f"stop_token_ids must be ints, got {stops!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in stops))


@dataclass(slots=True, frozen=True)
class SplitKVPolicy:
    """Split-KV (flash-decoding) policy: ``disabled``, ``fixed:N`` (N tokens a split) or ``auto``."""

    kind: Literal["disabled", "fixed", "auto"]
    split_size: int = 0

    @staticmethod
    def parse(text: "str | SplitKVPolicy") -> "SplitKVPolicy":
        if isinstance(text, SplitKVPolicy):
            return text
        if text == "disabled":
            return SplitKVPolicy("disabled")
        if text == "auto":
            return SplitKVPolicy("auto")
        if isinstance(text, str) and text.startswith("fixed:"):
            try:
                n = int(text.split(":", 1)[1])
            except ValueError:
                raise ConfigError(f"bad split-KV policy {text!r}: expected fixed:<tokens>") from None
            return SplitKVPolicy("fixed", n)
        raise ConfigError(f"bad split-KV policy {text!r}: expected 'disabled', 'fixed:N' or 'auto'")

    def __post_init__(self) -> None:
        if self.kind not in ("disabled", "fixed", "auto"):
            raise ConfigError(f"bad split-KV policy kind {self.kind!r}")
        if self.kind == "fixed" and self.split_size < 1:
            raise ConfigError(f"fixed split size must be >= 1, got {self.split_size}")

    def __str__(self) -> str:
        return f"fixed:{self.split_size}" if self.kind == "fixed" else self.kind


@dataclass(slots=True)
class TurnOutput:
    """One assistant turn of one sequence, as returned by ``rollout_run_turns``."""

    seq_id: int
    turn_index: int
    token_ids: list[int]
    logprobs: list[float] | None
    stop_reason: StopReason
    finished: bool                 # True when the sequence cannot continue (context limit) or is not agentic
    split_kv: str                  # the split-KV policy in force, e.g. "fixed:64"
    split_sizes: list[int | None] = field(default_factory=list)  # split size used at each decode step (None: unsplit)
    prefilled_tokens: int = 0      # tokens prefilled during this turn (pending token + observation on resume)
    context_len: int = 0           # tokens in the context when the turn started
    weights_version: int = 0       # version of the weights that sampled the turn's last token


@dataclass(slots=True)
class TurnSpan:
    """A half-open span ``[start, end)`` of ``Trajectory.token_ids``."""

    kind: Literal["prompt", "assistant", "observation"]
    start: int
    end: int


@dataclass(slots=True)
class Trajectory:
    """Everything a trainer needs about one finished sequence.

    ``assistant_mask[t] == 1`` iff ``token_ids[t]`` was sampled by the engine. ``logprobs[t]``
    is the log-probability of ``token_ids[t]`` when it was sampled and ``0.0`` elsewhere
    (``None`` when logprobs were not requested). A trainer computing next-token losses from
    logits at position ``t`` predicts ``token_ids[t+1]``, so its loss mask is
    ``loss_mask[t] = assistant_mask[t+1]``.
    """

    seq_id: int
    token_ids: list[int]
    assistant_mask: list[int]
    logprobs: list[float] | None
    prompt_len: int
    spans: list[TurnSpan]
    num_turns: int
    stop_reason: StopReason | None
    weights_versions: list[int] = field(default_factory=list)   # per token; -1 where not sampled

    def loss_mask(self) -> list[int]:
        """``assistant_mask`` shifted left by one: the mask over next-token logits."""
        return self.assistant_mask[1:] + [0]

    def to_dict(self) -> dict:
        """A JSON-ready dictionary of every field (one JSONL line per trajectory)."""
        return {
            "seq_id": self.seq_id, "token_ids": self.token_ids, "assistant_mask": self.assistant_mask,
            "logprobs": self.logprobs, "prompt_len": self.prompt_len,
            "spans": [{"kind": s.kind, "start": s.start, "end": s.end} for s in self.spans],
            "num_turns": self.num_turns, "stop_reason": self.stop_reason,
            "weights_versions": self.weights_versions,
        }

    def to_verl(self) -> dict:
        """The fields a verl-style trainer reads: the prompt, then everything after it as the response
        (assistant turns and observations), with the mask selecting the sampled tokens."""
        p = self.prompt_len
        return {
            "prompt_ids": self.token_ids[:p],
            "response_ids": self.token_ids[p:],
            "response_mask": self.assistant_mask[p:],
            "response_logprobs": self.logprobs[p:] if self.logprobs is not None else None,
            "num_turns": self.num_turns,
        }
