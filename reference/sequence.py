"""A sequence and its turn bookkeeping.

``token_ids`` holds every token of the context: prompt, sampled tokens, observations. The K/V
of the first ``num_cached`` tokens are in the cache. After a sample, the new token is the
*pending token*: it is in ``token_ids`` but has no K/V yet (``num_cached == len - 1``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .types import SamplingParams, StopReason, TurnOutput, TurnSpan, Trajectory


class SeqState(str, Enum):
    WAITING = "waiting"     # has tokens to prefill (fresh prompt, resumed, or preempted)
    RUNNING = "running"     # admitted: prefilling its chunks, then decoding
    PAUSED = "paused"       # turn ended; KV and block table kept; waits for rollout_continue
    FINISHED = "finished"   # cannot continue (context limit, or not agentic); waits for rollout_finish


@dataclass(slots=True)
class Sequence:
    seq_id: int
    params: SamplingParams
    agentic: bool
    token_ids: list[int]
    prompt_len: int
    state: SeqState = SeqState.WAITING
    num_cached: int = 0
    block_table: list[int] = field(default_factory=list)
    prefill_done: bool = False          # False until the last prefill chunk of the current turn has run
    assistant_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    spans: list[TurnSpan] = field(default_factory=list)
    turn_index: int = 0                 # completed turns
    turn_start: int = 0                 # index in token_ids where this turn's sampled tokens begin
    turn_prefilled: int = 0             # tokens prefilled during this turn (counted by the scheduler)
    turn_split_sizes: list[int | None] = field(default_factory=list)
    stop_reason: StopReason | None = None
    swapped: int = 0                    # pages of KV held in host memory (swap space) instead of the pool
    followers: list["Sequence"] = field(default_factory=list)   # group members waiting for this prompt's KV
    weights_versions: list[int] = field(default_factory=list)   # per token: weights that sampled it (-1: not sampled)
    weights_version: int = 0            # weights version of the last sampled token

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        self.assistant_mask = [0] * n
        self.logprobs = [0.0] * n
        self.weights_versions = [-1] * n
        self.spans = [TurnSpan("prompt", 0, n)]
        self.turn_start = n

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_uncached(self) -> int:
        return len(self.token_ids) - self.num_cached

    @property
    def turn_tokens(self) -> list[int]:
        return self.token_ids[self.turn_start:]

    def append_sampled(self, token: int, logprob: float, weights_version: int = 0) -> None:
        self.token_ids.append(token)
        self.assistant_mask.append(1)
        self.logprobs.append(logprob)
        self.weights_versions.append(weights_version)
        self.weights_version = weights_version

    def end_turn(self, reason: StopReason, split_kv: str) -> TurnOutput:
        """Close the current turn: record its span and build its ``TurnOutput``."""
        self.stop_reason = reason
        self.spans.append(TurnSpan("assistant", self.turn_start, self.num_tokens))
        out = TurnOutput(
            seq_id=self.seq_id,
            turn_index=self.turn_index,
            token_ids=self.token_ids[self.turn_start:],
            logprobs=self.logprobs[self.turn_start:] if self.params.logprobs else None,
            stop_reason=reason,
            finished=not self.agentic or reason == "context_limit",
            split_kv=split_kv,
            split_sizes=list(self.turn_split_sizes),
            prefilled_tokens=self.turn_prefilled,
            context_len=self.turn_start,
            weights_version=self.weights_version,
        )
        self.turn_index += 1
        return out

    def add_observation(self, obs: list[int]) -> None:
        """Append observation tokens and open the next turn (nothing is prefilled here)."""
        start = self.num_tokens
        self.token_ids.extend(obs)
        self.assistant_mask.extend([0] * len(obs))
        self.logprobs.extend([0.0] * len(obs))
        self.weights_versions.extend([-1] * len(obs))
        self.spans.append(TurnSpan("observation", start, self.num_tokens))
        self.turn_start = self.num_tokens
        self.turn_prefilled = 0
        self.turn_split_sizes = []
        self.prefill_done = False

    def trajectory(self) -> Trajectory:
        return Trajectory(
            seq_id=self.seq_id,
            token_ids=list(self.token_ids),
            assistant_mask=list(self.assistant_mask),
            logprobs=list(self.logprobs) if self.params.logprobs else None,
            prompt_len=self.prompt_len,
            spans=list(self.spans),
            num_turns=self.turn_index,
            stop_reason=self.stop_reason,
            weights_versions=list(self.weights_versions),
        )
