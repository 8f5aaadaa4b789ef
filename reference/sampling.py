"""Sampling: greedy, temperature, top-k, top-p, with counter-based randomness.

The randomness of the token sampled at absolute position ``pos`` of a sequence with seed
``seed`` is a pure function of ``(seed, pos)``: a hash gives every vocabulary entry ``i`` a
uniform ``u_i``, turned into Gumbel noise ``g_i = -log(-log(u_i))``, and the sampled token is
``argmax_i(l_i / T + g_i)`` over the entries the filters keep (the Gumbel-max trick). So a
token never depends on its batch mates, on the engine, or on how the context was split into
turns. The optimized engine's ``sampling.cu`` computes the same hash on uint32.

The hash (all arithmetic modulo 2**32)::

    mix(x):  x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B; x ^= x >> 16
    h   = mix(mix(mix(seed_lo ^ 0x9E3779B9) ^ seed_hi) ^ pos)
    r_i = mix(mix(h ^ i) + 0x632BE5AB)
    u_i = ((r_i >> 9) + 0.5) / 2**23          # float32, exact, in [2**-24, 1 - 2**-24]: never 0 or 1

23 bits keep every ``u_i`` exactly representable and strictly inside (0, 1), so the noise is always
finite (with 24 bits the top value would round to 1.0 and give ``+inf``). The argmax runs over the
surviving entries only.

Filters, applied to ``l = logits / T`` in float32:
  * top-k (``0 < k < V``): keep entries with ``l_i >= (k-th largest l)`` (ties at the k-th value kept).
  * top-p (``p < 1``): with ``q = softmax(l)`` over the top-k survivors, keep every entry whose
    probability is ``>= tau``, where ``tau`` is the smallest survivor probability such that the
    survivors with probability ``>= tau`` hold mass ``>= p``. (The most likely entry is always kept;
    entries tied at ``tau`` are all kept.)
"""

from __future__ import annotations

import torch

from .types import SamplingParams

M32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9
STREAM = 0x632BE5AB


def _mulmod32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for int64 tensors holding uint32 values, without int64 overflow."""
    lo = (x & 0xFFFF) * c                        # < 2**48
    hi = (((x >> 16) * c) & 0xFFFF) << 16        # the high half only matters modulo 2**16
    return (lo + hi) & M32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """The 32-bit finaliser above, on an int64 tensor of uint32 values."""
    x = x ^ (x >> 16)
    x = _mulmod32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mulmod32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _mix_int(v: int) -> int:
    return int(mix32(torch.tensor([v & M32], dtype=torch.int64))[0])


def sequence_key(seed: int, pos: int) -> int:
    """``h`` above: the per-(seed, position) key."""
    h = _mix_int((seed & M32) ^ GOLDEN)
    h = _mix_int(h ^ ((seed >> 32) & M32))
    return _mix_int(h ^ (pos & M32))


def uniforms(seed: int, pos: int, vocab_size: int) -> torch.Tensor:
    """``u_i`` for every vocabulary entry: float32 ``[V]`` strictly inside (0, 1)."""
    h = sequence_key(seed, pos)
    i = torch.arange(vocab_size, dtype=torch.int64)                      # [V]
    r = mix32((mix32(i ^ h) + STREAM) & M32)                              # [V]
    return ((r >> 9).to(torch.float32) + 0.5) * (1.0 / 8388608.0)        # [V]


def gumbel(seed: int, pos: int, vocab_size: int) -> torch.Tensor:
    """Gumbel noise ``-log(-log(u))``, float32 ``[V]``."""
    u = uniforms(seed, pos, vocab_size)
    return -torch.log(-torch.log(u))


def filtered_logits(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """``logits / T`` with the entries top-k and top-p drop set to ``-inf``. ``logits``: float32 ``[V]``."""
    l = logits.float() / sp.temperature                                  # [V]
    vocab = l.shape[0]
    if 0 < sp.top_k < vocab:
        kth = torch.topk(l, sp.top_k).values[-1]
        l = torch.where(l >= kth, l, torch.full_like(l, float("-inf")))
    if sp.top_p < 1.0:
        q = torch.softmax(l, dim=-1)                                     # [V]
        q_sorted, _ = torch.sort(q, descending=True)                     # [V]
        mass = torch.cumsum(q_sorted, dim=0)                             # [V]
        # first index where the running mass reaches p; the threshold is that entry's probability
        cut = int(torch.searchsorted(mass, torch.tensor([sp.top_p]), right=False)[0])
        cut = min(cut, vocab - 1)
        tau = q_sorted[cut]
        l = torch.where(q >= tau, l, torch.full_like(l, float("-inf")))
    return l


def sample_one(logits: torch.Tensor, sp: SamplingParams, pos: int) -> tuple[int, float]:
    """Sample the token at absolute position ``pos`` from float32 ``logits [V]``.

    Returns ``(token, logprob)`` where the logprob follows ``sp.logprobs_mode``.
    """
    logits = logits.float()
    raw = torch.log_softmax(logits, dim=-1)                              # [V]
    if sp.temperature == 0.0:
        tok = int(torch.argmax(logits))        # first index of the maximum
        return tok, float(raw[tok])
    l = filtered_logits(logits, sp)                                      # [V]
    g = gumbel(sp.seed, pos, l.shape[0])                                 # [V]
    keep = torch.isfinite(l)                                             # [V] the filters' survivors
    tok = int(torch.argmax(torch.where(keep, l + g, float("-inf"))))
    if sp.logprobs_mode == "raw":
        return tok, float(raw[tok])
    return tok, float(torch.log_softmax(l, dim=-1)[tok])


def sample_batch(logits: torch.Tensor, params: list[SamplingParams], positions: list[int]) -> tuple[list[int], list[float]]:
    """Row ``b`` of ``logits [B, V]`` is sampled with ``params[b]`` at ``positions[b]``."""
    toks: list[int] = []
    lps: list[float] = []
    for b in range(logits.shape[0]):
        t, lp = sample_one(logits[b], params[b], positions[b])
        toks.append(t)
        lps.append(lp)
    return toks, lps
