"""The independent oracles, all float32, on the CPU or the `--oracle-device`, on the harness's weights.

* model math: Hugging Face ``Qwen3ForCausalLM`` (LOGIT) and the reference's no-cache full recompute
  (``reference.oracle.dense_logits``: ORACLE, TURN margins, SAMPLE);
* attention: a dense float32 attention over the gathered pages (SPLITK, PAGED);
* the noise bound of a (model, dtype): the LOGIT rule measured on a probe of random sequences.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
from dataclasses import dataclass

import torch

import reference
from reference.model import Qwen3Model
from reference.oracle import dense_logits
from reference.sampling import filtered_logits, gumbel, sample_one
from reference.types import SamplingParams

from . import cases
from .tolerance import ErrorStats, as_dtype, logit_bound, noise_bound

# ---------------------------------------------------------------------------------- model oracles

#: where the float32 model oracles run (``--oracle-device``): the same fp32 math, on the CPU by default;
#: on a GPU machine "cuda" makes the qwen3-0.6b scale affordable (matmuls stay true fp32: TF32 is off)
DEVICE = "cpu"


def set_device(device: str) -> str:
    global DEVICE
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
    DEVICE = device
    dense_model.cache_clear()
    hf_model.cache_clear()
    _device_reference.cache_clear()
    return device


@functools.lru_cache(maxsize=4)
def dense_model(name: str, seed: int = cases.WEIGHT_SEED) -> Qwen3Model:
    cfg = cases.model_config(name)
    return Qwen3Model(cfg, cases.make_weights(name, seed), torch.float32, device=DEVICE)


def oracle_logits(name: str, ids: list[int], seed: int = cases.WEIGHT_SEED) -> torch.Tensor:
    """No-cache teacher-forced float32 logits ``[T, V]`` (row t predicts token t+1)."""
    return dense_logits(dense_model(name, seed), list(ids))


@functools.lru_cache(maxsize=2)
def hf_model(name: str, seed: int = cases.WEIGHT_SEED):
    """``transformers.Qwen3ForCausalLM`` in float32 with eager attention, on the harness's weights.

    Built on the oracle device; its parameters are the no-cache oracle's float32 tensors (``dense_model``),
    assigned rather than copied (read-only in both; one float32 copy of an 8B model is 33 GB)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM  # test-only dependency, imported late

    cfg = cases.model_config(name)
    hc = Qwen3Config(**cfg.to_hf_dict())
    with torch.device(DEVICE):
        model = Qwen3ForCausalLM._from_config(hc, attn_implementation="eager", dtype=torch.float32)
    w32 = {k: v for k, v in dense_model(name, seed).w.items() if not (k == "lm_head.weight" and cfg.tie_word_embeddings)}
    missing, unexpected = model.load_state_dict(w32, strict=False, assign=True)
    missing = [m for m in missing if not (m == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"HF oracle weights mismatch: missing {missing}, unexpected {unexpected}")
    if cfg.tie_word_embeddings:
        model.tie_weights()
    if torch.device(DEVICE).type == "cuda":
        torch.cuda.empty_cache()          # the parameters HF allocated (and replaced): 33 GB at qwen3-8b
    return model.requires_grad_(False).eval()


@torch.no_grad()
def hf_logits(name: str, ids: list[int], seed: int = cases.WEIGHT_SEED) -> torch.Tensor:
    """HF float32 logits ``[T, V]``, with an explicit all-ones attention mask (random ids contain the pad id)."""
    x = torch.tensor([list(ids)], dtype=torch.long, device=DEVICE)
    return hf_model(name, seed)(input_ids=x, attention_mask=torch.ones_like(x)).logits[0].float().cpu()


@functools.lru_cache(maxsize=8)
def reference_engine(name: str, dtype_name: str, block_size: int, seed: int = cases.WEIGHT_SEED):
    """The reference engine in ``dtype`` on the harness's weights (the LOGIT rule's baseline)."""
    # score() uses its own scratch pages: the pool only bounds max_model_len, so keep it small
    return reference.Engine.from_state_dict(cases.model_config(name), cases.make_weights(name, seed),
                                            dtype=dtype_name, block_size=block_size, max_model_len=2048,
                                            num_blocks=-(-2048 // block_size), max_num_seqs=1)


class DeviceReference:
    """The LOGIT rule's baseline for a GPU-only shape (``cases.GPU_SHAPES``): the reference model math
    (``reference.model.Qwen3Model``) in ``dtype`` on the oracle device, scoring like ``reference.Engine.score``.

    For one fresh sequence the reference engine's score is a paged prefill over contiguous pages, which is the
    dense causal attention of ``reference.oracle.dense_logits`` term for term (keys and values read back in the
    dtype, float32 softmax). Matrix products accumulate in float32, as on the CPU: cuBLAS's reduced-precision
    bf16 reductions are switched off for the call. Weights are shared with the harness's (bf16) tensors.
    """

    def __init__(self, name: str, dtype_name_: str, seed: int = cases.WEIGHT_SEED) -> None:
        self.model = Qwen3Model(cases.model_config(name), cases.make_weights(name, seed), as_dtype(dtype_name_),
                                device=DEVICE)

    def score(self, ids: list[int]) -> torch.Tensor:
        with _fp32_accumulation():
            return dense_logits(self.model, list(ids))


@contextlib.contextmanager
def _fp32_accumulation():
    mm = torch.backends.cuda.matmul
    old = mm.allow_bf16_reduced_precision_reduction, mm.allow_fp16_reduced_precision_reduction
    mm.allow_bf16_reduced_precision_reduction = mm.allow_fp16_reduced_precision_reduction = False
    try:
        yield
    finally:
        mm.allow_bf16_reduced_precision_reduction, mm.allow_fp16_reduced_precision_reduction = old


@functools.lru_cache(maxsize=4)
def _device_reference(name: str, dtype_name_: str, seed: int) -> DeviceReference:
    return DeviceReference(name, dtype_name_, seed)


def reference_scorer(name: str, dtype_name_: str, block_size: int, seed: int = cases.WEIGHT_SEED):
    """What ``err_reference`` of the LOGIT rule is measured with (an object with ``score(ids)``): the reference
    engine in ``dtype`` on the CPU, or ``DeviceReference`` for a GPU-only shape."""
    if name in cases.GPU_SHAPES:
        return _device_reference(name, dtype_name_, seed)
    return reference_engine(name, dtype_name_, block_size, seed)


def dtype_name(dtype) -> str:
    d = as_dtype(dtype)
    if d not in (torch.float32, torch.bfloat16):
        raise ValueError(f"the reference engine has no {d} mode; the LOGIT baseline needs float32 or bfloat16")
    return str(d).replace("torch.", "")


# ---------------------------------------------------------------------------------- the noise bound


@dataclass(frozen=True)
class Noise:
    """The noise bound of one (model, dtype)."""

    model: str
    dtype: torch.dtype
    reference: ErrorStats      # reference-in-dtype vs fp32 no-cache oracle on the probe
    logit_bound: float         # 2 x reference max err + ulp(dtype, magnitude)
    bound: float               # + float32 accumulation floor: the noise bound for token decisions

    def describe(self) -> str:
        return (f"noise bound {self.bound:.3e} ({self.model}, {str(self.dtype).replace('torch.', '')}: reference "
                f"max err {self.reference.max_err:.3e} at |logit| <= {self.reference.magnitude:.3g})")


def probe_ids(name: str, length: int) -> list[list[int]]:
    cfg = cases.model_config(name)
    rng = random.Random(12345)
    return [cases.random_tokens(rng, cfg.vocab_size, n) for n in (length, length // 2 + 3, 7)]


@functools.lru_cache(maxsize=16)
def noise(name: str, dtype, probe_len: int, block_size: int = 16) -> Noise:
    dtype = as_dtype(dtype)
    ref = reference_scorer(name, dtype_name(dtype), block_size)
    errs, means, mags = [], [], []
    for ids in probe_ids(name, probe_len):
        st = ErrorStats.of(ref.score(ids), oracle_logits(name, ids))
        errs.append(st.max_err)
        means.append(st.mean_err)
        mags.append(st.magnitude)
    stats = ErrorStats(max(errs), sum(means) / len(means), max(mags), float("nan"))
    lb = logit_bound(stats.max_err, stats.magnitude, dtype)
    return Noise(name, dtype, stats, lb, noise_bound(lb, stats.magnitude))


# ---------------------------------------------------------------------------------- token decisions


def top2_margin(row: torch.Tensor) -> float:
    v = torch.topk(row.float(), 2).values
    return float(v[0] - v[1])


@dataclass(frozen=True)
class Decision:
    token: int              # what the reference sampler picks on the oracle logits
    decisive: bool          # ... and keeps picking under every perturbation within the noise bound
    margin: float           # greedy: top-1/top-2 margin; sampling: gap of the perturbed scores


def decide(row: torch.Tensor, sp: SamplingParams, pos: int, bound: float) -> Decision:
    """The reference sampler's choice at absolute position ``pos`` and whether noise of ``bound`` could flip it.

    Greedy: decisive iff margin > bound. Sampling: every logit may move by ``bound / 2``; the step is
    decisive when ``sample_one`` keeps its token with the winner lowered and every other entry raised,
    and with each competitor within reach raised alone (the rest lowered).
    """
    row = row.float()
    tok, _ = sample_one(row, sp, pos)
    if sp.temperature == 0.0:
        m = top2_margin(row)
        return Decision(tok, m > bound, m)
    d = bound / 2
    worst = row + d
    worst[tok] = row[tok] - d
    if sample_one(worst, sp, pos)[0] != tok:
        return Decision(tok, False, 0.0)
    kept = torch.isfinite(filtered_logits(row, sp))
    floor = float(row[kept].min()) - 4 * d                     # entries that could enter the filtered set
    s = row / sp.temperature + gumbel(sp.seed, pos, row.shape[0])
    threat = (s >= s[tok] - 2 * d / sp.temperature) & (row >= floor)
    threat[tok] = False
    idx = torch.nonzero(threat).flatten()
    if idx.numel() > 64:
        return Decision(tok, False, 0.0)
    for j in idx.tolist():
        v = row - d
        v[j] = row[j] + d
        if sample_one(v, sp, pos)[0] != tok:
            return Decision(tok, False, 0.0)
    kept_s = s[kept].clone()
    gap = float(s[tok] - kept_s[kept_s < s[tok]].max()) if (kept_s < s[tok]).any() else math.inf
    return Decision(tok, True, gap)


def oracle_logprob(row: torch.Tensor, sp: SamplingParams, token: int) -> float:
    """The logprob a correct engine reports for ``token`` under ``sp.logprobs_mode``."""
    row = row.float()
    if sp.logprobs_mode == "raw" or sp.temperature == 0.0:
        return float(torch.log_softmax(row, -1)[token])
    return float(torch.log_softmax(filtered_logits(row, sp), -1)[token])


def logprob_stable(row: torch.Tensor, sp: SamplingParams, bound: float) -> bool:
    """``processed`` logprobs are comparable when the filtered set does not move under the noise."""
    if sp.logprobs_mode == "raw" or sp.temperature == 0.0:
        return True
    base = torch.isfinite(filtered_logits(row, sp))
    for shift in (bound / 2, -bound / 2):
        v = row.float() + shift * (2 * base.float() - 1)      # kept entries moved one way, the rest the other
        if not torch.equal(torch.isfinite(filtered_logits(v, sp)), base):
            return False
    return True


# ---------------------------------------------------------------------------------- attention oracle


def gather(cache: torch.Tensor, table_row: torch.Tensor, n: int) -> torch.Tensor:
    """Rows ``0 .. n-1`` of one sequence from its pages: ``[n, n_kv, D]`` (float32)."""
    bs = cache.shape[1]
    if n == 0:
        return cache.new_zeros((0,) + tuple(cache.shape[2:])).float()
    pos = torch.arange(n)
    pages = table_row.long()[pos // bs]
    return cache.float()[pages, pos % bs]


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor,
                    scale: float | None = None) -> torch.Tensor:
    """``q [t, n_q, D]`` over ``k, v [L, n_kv, D]`` with a boolean ``visible [t, L]``; float64 math, float32 out.

    Rows with nothing visible give 0.
    """
    t, n_q, D = q.shape
    scale = D ** -0.5 if scale is None else scale
    if k.shape[0] == 0:
        return torch.zeros(t, n_q, D)
    group = n_q // k.shape[1]
    kk = k.double().repeat_interleave(group, dim=1)
    vv = v.double().repeat_interleave(group, dim=1)
    s = torch.einsum("thd,lhd->htl", q.double(), kk) * scale
    s = s.masked_fill(~visible[None], float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.where(visible[None], torch.exp(s - m), torch.zeros_like(s))
    den = e.sum(-1, keepdim=True)
    p = e / torch.where(den > 0, den, torch.ones_like(den))
    return torch.einsum("htl,lhd->thd", p, vv).float()


def dense_lse(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Natural-log sum-exp of the scores of ``q [n_q, D]`` over ``k [L, n_kv, D]``: ``[n_q]`` (-inf for L = 0)."""
    n_q, D = q.shape
    scale = D ** -0.5 if scale is None else scale
    if k.shape[0] == 0:
        return torch.full((n_q,), float("-inf"))
    kk = k.double().repeat_interleave(n_q // k.shape[1], dim=1)
    s = torch.einsum("hd,lhd->hl", q.double(), kk) * scale
    return torch.logsumexp(s, -1).float()
