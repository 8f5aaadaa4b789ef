"""The tolerance rules of the contract (stated in ``docs/contract.md``, "Tolerance rules").

Pure functions and constants; the meta-tests check them on hand-made numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MANTISSA_BITS = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10, torch.float64: 52}

#: a greedy step is decisive when the oracle's top-1/top-2 margin exceeds this multiple of the noise bound
DECISIVE_MULTIPLE = 1.0
#: float32 accumulation floor of the noise bound, in float32 rounding steps at the logits' magnitude
ACCUM_FLOOR_STEPS = 64
#: ORACLE / SAMPLE: minimum share of decisive steps, by engine dtype
MIN_DECISIVE_SHARE = {torch.float32: 0.8, torch.bfloat16: 0.3, torch.float16: 0.3}
#: ORACLE free-running check: its minimum decisive share is this fraction of MIN_DECISIVE_SHARE (its token decisions
#: repeat the teacher-forced checks, which carry the full share; it adds the end-to-end stop rule of the oracle)
FREE_RUNNING_SHARE_FRACTION = 1 / 3
#: TURN (and MEM, SAMPLE token comparisons): minimum share of steps actually compared
MIN_COMPARED_SHARE = 0.9
#: The shares above are the shares a clause's workload is expected to reach. Whether a step is decisive
#: (or compared) depends on the trajectory, and the trajectory on the last bits of the engine's logits at
#: near-ties, so the observed share over n steps scatters around the expectation like a binomial
#: proportion. A clause requires the expected share minus SHARE_SIGMAS binomial standard deviations at
#: its n (``share_floor``): a guard against a vacuous pass, not an accuracy tolerance -- every decisive
#: or compared step is still checked exactly, and one mismatch fails the clause.
SHARE_SIGMAS = 3.0

_DTYPE_NAMES = {
    "float32": torch.float32, "fp32": torch.float32, "f32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


def as_dtype(x) -> torch.dtype:
    """A torch dtype from a torch dtype, a numpy-ish dtype or a name (``"bfloat16"``, ``"bf16"``...)."""
    if isinstance(x, torch.dtype):
        return x
    name = str(x).replace("torch.", "").lower()
    if name in _DTYPE_NAMES:
        return _DTYPE_NAMES[name]
    raise ValueError(f"unknown dtype {x!r}")


def ulp(dtype, magnitude: float) -> float:
    """One rounding step of ``dtype`` at ``magnitude``: ``2 ** (floor(log2 m) - mantissa_bits)``."""
    dtype = as_dtype(dtype)
    m = abs(float(magnitude))
    if not math.isfinite(m):
        raise ValueError(f"magnitude must be finite, got {magnitude}")
    m = max(m, torch.finfo(dtype).tiny)
    return 2.0 ** (math.floor(math.log2(m)) - MANTISSA_BITS[dtype])


def logit_bound(err_reference: float, magnitude: float, dtype) -> float:
    """The flash-attention rule: ``2 * err_reference + ulp(dtype, magnitude)``."""
    return 2.0 * float(err_reference) + ulp(dtype, magnitude)


def noise_bound(logit_bound_max: float, magnitude: float) -> float:
    """Noise bound for token decisions: the LOGIT bound plus the float32 accumulation floor."""
    return float(logit_bound_max) + ACCUM_FLOOR_STEPS * ulp(torch.float32, magnitude)


def min_decisive_share(dtype) -> float:
    return MIN_DECISIVE_SHARE.get(as_dtype(dtype), 0.3)


def min_free_running_share(dtype) -> float:
    return FREE_RUNNING_SHARE_FRACTION * min_decisive_share(dtype)


def share_floor(expected: float, n: int) -> float:
    """The share a clause requires of ``n`` steps whose expected share is ``expected``:
    ``expected - SHARE_SIGMAS * sqrt(expected * (1 - expected) / n)``, never below 0
    (``n = 0``: the expectation itself, which an empty tally cannot reach)."""
    if n <= 0:
        return expected
    return max(0.0, expected - SHARE_SIGMAS * math.sqrt(expected * (1.0 - expected) / n))


@dataclass(frozen=True)
class ErrorStats:
    max_err: float
    mean_err: float
    magnitude: float          # max |oracle|
    cosine: float

    @staticmethod
    def of(x: torch.Tensor, oracle: torch.Tensor) -> "ErrorStats":
        x = x.detach().to("cpu", torch.float64)
        o = oracle.detach().to("cpu", torch.float64)
        d = (x - o).abs()
        cos = torch.nn.functional.cosine_similarity(x.flatten(), o.flatten(), dim=0)
        if not torch.isfinite(d).all():
            return ErrorStats(float("inf"), float("inf"), float(o.abs().max()) if o.numel() else 0.0, float("nan"))
        return ErrorStats(float(d.max()) if d.numel() else 0.0, float(d.mean()) if d.numel() else 0.0,
                          float(o.abs().max()) if o.numel() else 0.0, float(cos))


@dataclass(frozen=True)
class RuleCheck:
    """The LOGIT rule applied to one comparison."""

    engine: ErrorStats
    reference: ErrorStats
    dtype: torch.dtype
    max_bound: float
    mean_bound: float

    @staticmethod
    def of(engine: ErrorStats, reference: ErrorStats, dtype) -> "RuleCheck":
        dtype = as_dtype(dtype)
        mag = max(engine.magnitude, reference.magnitude)
        return RuleCheck(engine, reference, dtype,
                         logit_bound(reference.max_err, mag, dtype), logit_bound(reference.mean_err, mag, dtype))

    @property
    def ok(self) -> bool:
        return self.engine.max_err <= self.max_bound and self.engine.mean_err <= self.mean_bound

    def describe(self) -> str:
        e, r = self.engine, self.reference
        return (f"max |err| {e.max_err:.3e} (bound {self.max_bound:.3e} = 2 x reference {r.max_err:.3e} + "
                f"ulp({str(self.dtype).replace('torch.', '')}, {max(e.magnitude, r.magnitude):.3g})); "
                f"mean |err| {e.mean_err:.3e} (bound {self.mean_bound:.3e}); cosine {e.cosine:.8f}")
