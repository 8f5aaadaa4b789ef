"""Chat-template helper for Qwen3: observation tokens built append-only.

An agent loop must never re-tokenise past turns: the trainer needs the exact ids the model
sampled. After an assistant turn that ended with ``<|im_end|>`` (the stop token), Qwen3's chat
template continues with ``"\\n<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n"``. This
helper tokenises only that continuation — the newline after ``<|im_end|>`` included, since the
model never samples it — so ``prompt + turn 1 + observation 1 + turn 2 + ...`` equals what the
template gives for the whole conversation.

It needs a Hugging Face tokenizer (``transformers``) but imports nothing from it itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


@dataclass(slots=True)
class ChatTemplate:
    """Token ids for an append-only Qwen3 conversation. ``tokenizer``: a transformers tokenizer."""

    tokenizer: Any

    def __post_init__(self) -> None:
        for tok in (IM_START, IM_END):
            if self.tokenizer.convert_tokens_to_ids(tok) in (None, self.tokenizer.unk_token_id):
                raise ConfigError(f"the tokenizer has no {tok} token")

    @property
    def im_end_id(self) -> int:
        return int(self.tokenizer.convert_tokens_to_ids(IM_END))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The first prompt: the template with the generation prompt (``<|im_start|>assistant\\n``)."""
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):   # some versions return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def observation_ids(self, content: str, last_turn: list[int], role: str = "tool") -> list[int]:
        """The ids that follow an assistant turn ``last_turn``: close it if the model did not (a turn cut by
        ``max_tokens``), then the newline, the ``user`` (or tool-response) message and the next generation prompt."""
        if role not in ("tool", "user"):
            raise ConfigError(f"role must be 'tool' or 'user', got {role!r}")
        body = f"<tool_response>\n{content}\n</tool_response>" if role == "tool" else content
        close = [] if last_turn and last_turn[-1] == self.im_end_id else [self.im_end_id]
        return close + self.encode(f"\n{IM_START}user\n{body}{IM_END}\n{IM_START}assistant\n")
