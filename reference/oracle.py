"""The no-cache oracle: full recompute of the whole context at every step.

It shares only the model weights and the sampling function with the engine: no pages, no
block tables, no split-KV, no pending token. Each step runs a dense causal forward over all
tokens so far and samples from the last row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import dense_causal_attention
from .model import Qwen3Model
from .sampling import sample_one
from .types import SamplingParams


@torch.no_grad()
def dense_logits(model: Qwen3Model, token_ids: list[int]) -> torch.Tensor:
    """Teacher-forced float32 logits ``[T, V]`` with dense causal attention."""
    ids = torch.tensor(token_ids, device=model.device)
    pos = torch.arange(len(token_ids), device=model.device)
    hidden = model.forward(ids, pos, lambda layer, q, k, v: dense_causal_attention(q, k, v))
    return model.logits(hidden).cpu()


@dataclass(slots=True)
class OracleTurn:
    token_ids: list[int]
    logprobs: list[float]
    margins: list[float]        # top-1 minus top-2 logit at each step
    stop_reason: str


@torch.no_grad()
def oracle_generate(model: Qwen3Model, prompt: list[int], sp: SamplingParams, max_model_len: int) -> OracleTurn:
    """One turn by full recompute: the same stopping rules as the engine."""
    ctx = list(prompt)
    toks: list[int] = []
    lps: list[float] = []
    margins: list[float] = []
    while True:
        logits = dense_logits(model, ctx)[-1]                             # [V]
        top2 = torch.topk(logits, 2).values
        margins.append(float(top2[0] - top2[1]))
        tok, lp = sample_one(logits, sp, len(ctx))
        ctx.append(tok)
        toks.append(tok)
        lps.append(lp)
        if len(ctx) >= max_model_len:
            return OracleTurn(toks, lps, margins, "context_limit")
        if tok in sp.stop_token_ids:
            return OracleTurn(toks, lps, margins, "stop_token")
        if len(toks) >= sp.max_tokens:
            return OracleTurn(toks, lps, margins, "max_tokens")
