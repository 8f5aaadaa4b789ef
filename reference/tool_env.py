"""A small built-in tool environment for the demo rollout and the tests.

It plays the tool side of an agent loop: after each assistant turn it answers with
observation tokens that depend only on ``(seed, seq_id, turn_index, the turn's tokens)``, so
a rollout is reproducible. Lengths vary turn to turn (empty observations included) and
span several KV blocks, which is what exercises resume.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from .errors import ConfigError


@dataclass(slots=True)
class EchoToolEnv:
    """Answers a turn with ``[marker] + a deterministic scramble of the turn's tokens``.

    ``max_obs`` bounds an observation's length; ``empty_every`` makes every n-th answer empty
    (0 disables), as a tool that returns nothing would.
    """

    vocab_size: int
    max_obs: int = 48
    seed: int = 0
    empty_every: int = 4

    def __post_init__(self) -> None:
        if self.vocab_size < 2 or self.max_obs < 1:
            raise ConfigError("EchoToolEnv needs vocab_size >= 2 and max_obs >= 1")

    def observe(self, seq_id: int, turn_index: int, turn_tokens: list[int]) -> list[int]:
        key = zlib.crc32(f"{self.seed}:{seq_id}:{turn_index}:{turn_tokens}".encode())
        if self.empty_every and (turn_index + 1) % self.empty_every == 0:
            return []
        n = 1 + key % self.max_obs
        marker = key % self.vocab_size
        body = [(t * 31 + i * 17 + key) % self.vocab_size for i, t in enumerate((turn_tokens * n)[:n - 1])]
        return [marker] + body
