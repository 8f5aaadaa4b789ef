"""Seeded case generators: model shapes, weights, scales, prompts, turn schedules, kernel inputs.

Everything is a pure function of its arguments (seeds included), so a failure message can rebuild
its case in a few lines.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import zlib
from dataclasses import dataclass, field

import torch

from reference.config import ModelConfig, named_config
from reference.types import SamplingParams
from reference.weights import expected_shapes, random_weights

# ---------------------------------------------------------------------------------- model shapes


def _shape(name: str, V: int, H: int, I: int, L: int, nq: int, nkv: int, D: int) -> ModelConfig:
    return ModelConfig(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=L,
                       num_attention_heads=nq, num_key_value_heads=nkv, head_dim=D,
                       max_position_embeddings=4096, tie_word_embeddings=False, eos_token_id=None, name=name)


#: name -> (model config, engine defaults). Tiny shapes with different GQA ratios, head dims, block sizes and
#: split-KV policies (split sizes that are not multiples of the block size, more splits than blocks, auto).
MODELS: dict[str, tuple[ModelConfig, dict]] = {
    "gqa2-d32": (_shape("gqa2-d32", 512, 64, 128, 2, 4, 2, 32), {"block_size": 4, "split_kv": "fixed:8", "max_model_len": 1024}),
    "mha-d16": (_shape("mha-d16", 256, 48, 96, 2, 3, 3, 16), {"block_size": 8, "split_kv": "fixed:5", "max_model_len": 1024}),
    "gqa4-d64": (_shape("gqa4-d64", 384, 64, 128, 2, 8, 2, 64), {"block_size": 5, "split_kv": "auto", "max_model_len": 1024}),
    "mqa-d8": (_shape("mqa-d8", 320, 32, 64, 3, 4, 1, 8), {"block_size": 16, "split_kv": "fixed:3", "max_model_len": 1024}),
    "gqa8-d128": (_shape("gqa8-d128", 256, 64, 128, 2, 8, 1, 128),
                  {"block_size": 32, "split_kv": "fixed:48", "max_model_len": 1024}),
    # the real Qwen3-0.6B shape (vocab 151936, 28 layers, GQA 2, head_dim 128), with an untied lm_head:
    # tied random embeddings make a random model predict "repeat the last token", which tests nothing.
    "qwen3-0.6b-untied": (dataclasses.replace(named_config("qwen3-0.6b"), tie_word_embeddings=False,
                                              name="qwen3-0.6b-untied"),
                          {"block_size": 16, "split_kv": "auto", "max_model_len": 2048, "num_blocks": 4096}),
    # the real Qwen3-8B shape (vocab 151936, 36 layers, hidden 4096, GQA 4, head_dim 128; its lm_head is untied):
    # a GPU-only shape (GPU_SHAPES) that runs a subset of the tests, at the gpu scale only
    "qwen3-8b": (dataclasses.replace(named_config("qwen3-8b"), tie_word_embeddings=False, name="qwen3-8b"),
                 {"block_size": 16, "split_kv": "auto", "max_model_len": 2048, "num_blocks": 256}),
}


@dataclass(frozen=True)
class GpuShape:
    """A shape too big for the CPU (8B parameters: 33 GB in float32, minutes per CPU forward).

    Its weights are drawn on a CUDA device in bfloat16 (``make_weights``), its fp32 oracles and the LOGIT
    rule's reference baseline run on the oracle device (``--oracle-device cuda``), the engine under test must
    be on a GPU, and only ``tests`` are collected at this shape (the others do not get it as a parameter).
    Anything else is a skip with the reason (``unavailable``), never a pass.
    """

    tests: frozenset[str]          # "module::test function"
    min_gpu_gib: float             # GPU memory it needs: bf16 weights, fp32 oracle, two engines alive at once


GPU_SHAPES: dict[str, GpuShape] = {
    # LOGIT (logits vs the fp32 HF oracle at 5 lengths up to probe_len, and prefixes) and SPLITK (every split
    # size at GQA 4 / head_dim 128, empty splits and merges, the engine's split policies) are what the shape adds
    # over qwen3-0.6b (GQA 2), plus paged continued prefill across block boundaries; about 2 minutes on an H200
    "qwen3-8b": GpuShape(frozenset({
        "test_logit::test_score_matches_hf_oracle",
        "test_logit::test_prefix_scores_like_whole",
        "test_splitk::test_every_split_size",
        "test_splitk::test_partials_empty_splits_and_merge",
        "test_splitk::test_policy_reported_and_tokens_agree",
        "test_paged::test_block_boundaries",
    }), min_gpu_gib=96.0),
}


def runs_test(model: str, test: str) -> bool:
    """Whether ``test`` (``"module::function"``) is collected at ``model``: every test at the ordinary shapes,
    the listed subset at a GPU-only shape."""
    return model not in GPU_SHAPES or test in GPU_SHAPES[model].tests


def unavailable(model: str, oracle_device: str, engine_device: str) -> str | None:
    """Why a GPU-only shape cannot run here (``None``: it can, or it is an ordinary shape)."""
    shape = GPU_SHAPES.get(model)
    if shape is None:
        return None
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (its weights are drawn there and its fp32 oracles run there)"
    if not str(oracle_device).startswith("cuda"):
        return (f"needs --oracle-device cuda (fp32 oracles of {model} on {oracle_device} do not fit the time; "
                f"got --oracle-device {oracle_device})")
    if str(engine_device).startswith("cpu"):
        return f"the engine under test runs on the CPU ({engine_device}); {model} needs an engine on a GPU"
    gib = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30
    if gib < shape.min_gpu_gib:
        return f"needs about {shape.min_gpu_gib:.0f} GiB of GPU memory, this GPU has {gib:.0f} GiB"
    return None


WEIGHT_SEED = 0


def model_config(name: str) -> ModelConfig:
    """A fresh copy of a named harness shape (or of a ``reference`` named config)."""
    if name in MODELS:
        return dataclasses.replace(MODELS[name][0])
    return named_config(name)


def engine_defaults(name: str) -> dict:
    return dict(MODELS[name][1]) if name in MODELS else {"block_size": 16}


def draw_weights(cfg: ModelConfig, seed: int, device: str | torch.device) -> dict[str, torch.Tensor]:
    """Random weights by ``reference.weights.random_tensor``'s rule (one generator per tensor, seeded by
    ``(seed, name)``; std ``1/sqrt(fan_in)``, embedding std 1, norms ``1 + 0.1 N(0, 1)``), drawn by a generator
    of ``device`` and kept there in bfloat16. On a CUDA device: seconds for 8B parameters, where the CPU takes a
    minute and 33 GB. Deterministic, but only the CPU generator gives ``reference.weights.random_weights``'s values."""
    dev = torch.device(device)
    out = {}
    for name, shape in expected_shapes(cfg).items():
        g = torch.Generator(device=dev)
        g.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
        w = torch.randn(shape, generator=g, device=dev)
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * w
        elif name != "model.embed_tokens.weight":
            w = w * shape[-1] ** -0.5
        out[name] = w.to(torch.bfloat16)
        del w
    return out


def draw_on_cuda(cfg: ModelConfig, seed: int = WEIGHT_SEED) -> dict[str, torch.Tensor]:
    """``draw_weights`` on the current CUDA device: the weights of a GPU-only shape."""
    if not torch.cuda.is_available():
        raise RuntimeError(f"the weights of {cfg.name} are drawn on a CUDA GPU and none is available")
    return draw_weights(cfg, seed, torch.device("cuda", torch.cuda.current_device()))


@functools.lru_cache(maxsize=8)
def _weights_cached(name: str, seed: int) -> dict[str, torch.Tensor]:
    if name in GPU_SHAPES:
        return draw_on_cuda(model_config(name), seed)
    w = random_weights(model_config(name), seed, dtype=torch.bfloat16)
    return {k: v.float() for k, v in w.items()}


def make_weights(cfg_or_name: ModelConfig | str, seed: int = WEIGHT_SEED) -> dict[str, torch.Tensor]:
    """``reference.weights.random_weights`` rounded to bfloat16-representable values, as float32 CPU tensors;
    for a GPU-only shape (``GPU_SHAPES``), ``draw_on_cuda``: bfloat16 tensors on the CUDA device.

    A bf16 engine and the fp32 oracle then compute with identical weights. Returns a fresh dict
    (the tensors are shared and must not be modified in place).
    """
    name = cfg_or_name if isinstance(cfg_or_name, str) else cfg_or_name.name
    return dict(_weights_cached(name, seed))


# ---------------------------------------------------------------------------------- scales


@dataclass(frozen=True)
class Scale:
    name: str
    models: tuple[str, ...]          # shapes of the model-level tests
    n_seqs: int                      # sequences of a rollout workload
    n_turns: int                     # turns per sequence
    max_tokens: int                  # per-turn budget
    max_prompt: int                  # longest random prompt
    obs_max_blocks: int              # longest observation, in blocks
    examples: int                    # hypothesis examples of the kernel-level clauses
    oracle_seqs: int                 # sequences checked against the oracles per test
    probe_len: int                   # length of the noise-bound probe sequences


SCALES = {
    "ci": Scale("ci", ("gqa2-d32", "mha-d16", "gqa4-d64", "mqa-d8", "gqa8-d128"), n_seqs=8, n_turns=4, max_tokens=8,
                max_prompt=24, obs_max_blocks=4, examples=25, oracle_seqs=8, probe_len=48),
    # qwen3-8b: the GPU_SHAPES subset only (-k qwen3-0.6b leaves it out, -k qwen3-8b selects it)
    "gpu": Scale("gpu", ("gqa2-d32", "mha-d16", "gqa4-d64", "mqa-d8", "gqa8-d128", "qwen3-0.6b-untied", "qwen3-8b"),
                 n_seqs=64, n_turns=8, max_tokens=16, max_prompt=96, obs_max_blocks=6, examples=60,
                 oracle_seqs=16, probe_len=128),
}


# ---------------------------------------------------------------------------------- rollout workloads


@dataclass(frozen=True)
class BoundaryObs:
    """An observation sized at continue time so the context ends ``offset`` tokens after a block boundary."""

    offset: int        # -1, 0, +1, ... relative to the next block boundary
    seed: int

    def resolve(self, context_len: int, bs: int, vocab: int) -> list[int]:
        n = (-context_len) % bs + self.offset
        while n < 0:
            n += bs
        return random_tokens(random.Random(self.seed), vocab, n)


@dataclass
class SeqPlan:
    """One sequence of a workload: its prompt, sampling, observations (one per continue) and timing."""

    prompt: list[int]
    sp: SamplingParams
    observations: list  # list[int] or BoundaryObs, one per continue
    add_round: int = 0                       # run_turns round at which it is added
    hold_rounds: frozenset[int] = frozenset()  # rounds in which it stays paused instead of continuing

    @property
    def n_turns(self) -> int:
        return len(self.observations) + 1


@dataclass
class Workload:
    plans: list[SeqPlan]
    note: str = ""
    sp_names: dict[int, str] = field(default_factory=dict)


def random_tokens(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def boundary_lengths(bs: int, upto: int) -> list[int]:
    """Lengths on and around block boundaries: k*bs - 1, k*bs, k*bs + 1 (positive, <= upto)."""
    out = set()
    k = 1
    while k * bs - 1 <= upto:
        for n in (k * bs - 1, k * bs, k * bs + 1):
            if 1 <= n <= upto:
                out.add(n)
        k += 1
    return sorted(out)


def stop_set(rng: random.Random, vocab: int, share: float = 0.03) -> tuple[int, ...]:
    n = max(1, int(vocab * share))
    return tuple(sorted(rng.sample(range(vocab), n)))


def greedy_workload(cfg: ModelConfig, bs: int, scale: Scale, seed: int, *, n_seqs: int | None = None,
                    n_turns: int | None = None, obs_kind: str = "mixed", prompt_kind: str = "mixed",
                    stagger: bool = False, holds: bool = False, temperature: float = 0.0,
                    max_tokens: int | None = None, max_prompt: int | None = None) -> Workload:
    """A seeded multi-turn workload.

    ``obs_kind``: ``mixed`` (empty, short, block-boundary and multi-block observations), ``empty``,
    ``long`` (many blocks), ``boundary`` (observations that land the context on a block boundary).
    ``prompt_kind``: ``mixed`` or ``boundary`` (prompt lengths k*bs - 1, k*bs, k*bs + 1).
    ``max_prompt``: the longest prompt, boundary lengths included, for an engine whose ``max_model_len`` is below
    the scale's prompts; a cap at or above the scale's longest prompt (``max(max_prompt, 2 * bs + 1)``) changes
    nothing.
    """
    rng = random.Random(seed)
    V = cfg.vocab_size
    n_seqs = n_seqs or scale.n_seqs
    n_turns = n_turns or scale.n_turns
    stops = stop_set(rng, V)
    longest = scale.max_prompt if max_prompt is None else min(scale.max_prompt, max_prompt)
    bl = [n for n in boundary_lengths(bs, max(longest, 2 * bs + 1)) if max_prompt is None or n <= max_prompt]
    greedy_pool = [SamplingParams(temperature=0.0, max_tokens=max_tokens or mt, stop_token_ids=stops, logprobs=True)
                   for mt in (scale.max_tokens, max(2, scale.max_tokens // 2 + 1))]
    plans = []
    for i in range(n_seqs):
        if prompt_kind == "boundary" or (prompt_kind == "mixed" and i % 3 == 0):
            plen = bl[rng.randrange(len(bl))]
        else:
            plen = rng.randint(1, longest)
        if temperature == 0:   # a small pool of greedy params, so single-shot generate batches across sequences
            sp = greedy_pool[i % len(greedy_pool)]
        else:
            sp = SamplingParams(temperature=temperature, top_k=rng.choice([0, 20]), top_p=rng.choice([1.0, 0.9]),
                                max_tokens=max_tokens or scale.max_tokens, stop_token_ids=stops,
                                seed=rng.randrange(2**32), logprobs=True,
                                logprobs_mode=rng.choice(["raw", "processed"]))
        obs = []
        for _ in range(n_turns - 1):
            kind = obs_kind
            if kind == "mixed":
                kind = rng.choice(["empty", "short", "boundary", "long", "short"])
            if kind == "empty":
                n = 0
            elif kind == "short":
                n = rng.randint(1, max(1, bs))
            elif kind == "long":
                n = rng.randint(2 * bs + 1, scale.obs_max_blocks * bs + 1)
            else:  # boundary: sized when it is sent, so the context ends on / next to a block boundary
                obs.append(BoundaryObs(rng.choice([-1, 0, 0, 1, bs]), rng.randrange(2**31)))
                continue
            obs.append(random_tokens(rng, V, n))
        add_round = rng.randrange(0, max(1, n_turns - 1)) if stagger and i % 2 == 1 else 0
        hold = frozenset({rng.randrange(1, n_turns + 1)}) if holds and i % 3 == 1 else frozenset()
        plans.append(SeqPlan(random_tokens(rng, V, plen), sp, obs, add_round, hold))
    return Workload(plans, note=f"greedy_workload(seed={seed}, obs_kind={obs_kind!r}, prompt_kind={prompt_kind!r}, "
                                f"stagger={stagger}, holds={holds}, temperature={temperature})")


# ---------------------------------------------------------------------------------- kernel inputs


@dataclass(frozen=True)
class KVSpec:
    """A paged KV cache holding ``lens[b]`` tokens for sequence ``b``; unused slots and pages hold NaN."""

    seed: int
    n_q: int
    n_kv: int
    head_dim: int
    block_size: int
    lens: tuple[int, ...]
    extra_pages: int = 2           # pages nobody uses (NaN)
    shuffle: bool = True           # page ids in random order
    scale_qk: float = 1.5          # q/k magnitude (peakier softmax)

    def pages_needed(self) -> list[int]:
        return [(n + self.block_size - 1) // self.block_size for n in self.lens]

    @property
    def num_blocks(self) -> int:
        return sum(self.pages_needed()) + self.extra_pages


@dataclass
class KVTensors:
    k_cache: torch.Tensor          # [N, bs, n_kv, D] float32, NaN where nothing was written
    v_cache: torch.Tensor
    block_tables: torch.Tensor     # [B, M] int32, -1 past each table
    seq_lens: torch.Tensor         # [B] int32


def build_kv(spec: KVSpec) -> KVTensors:
    g = torch.Generator().manual_seed(spec.seed)
    N, bs = spec.num_blocks, spec.block_size
    shape = (N, bs, spec.n_kv, spec.head_dim)
    k = torch.full(shape, float("nan"))
    v = torch.full(shape, float("nan"))
    perm = torch.randperm(N, generator=g).tolist() if spec.shuffle else list(range(N))
    need = spec.pages_needed()
    M = max(need + [1])
    tables = torch.full((len(spec.lens), M), -1, dtype=torch.int32)
    nxt = 0
    for b, n in enumerate(spec.lens):
        for j in range(need[b]):
            page = perm[nxt]
            nxt += 1
            tables[b, j] = page
            rows = min(bs, n - j * bs)
            k[page, :rows] = spec.scale_qk * torch.randn(rows, spec.n_kv, spec.head_dim, generator=g)
            v[page, :rows] = torch.randn(rows, spec.n_kv, spec.head_dim, generator=g)
    return KVTensors(k, v, tables, torch.tensor(spec.lens, dtype=torch.int32))


def build_queries(seed: int, n: int, n_q: int, head_dim: int, scale_qk: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 7919)
    return scale_qk * torch.randn(n, n_q, head_dim, generator=g)


@dataclass(frozen=True)
class PrefillSpec:
    """``kv`` plus, for each sequence, the first new query position (its prefix length) and padding rows."""

    kv: KVSpec
    starts: tuple[int, ...]        # queries of sequence b are positions starts[b] .. lens[b]-1
    pad_rows: int = 0              # q_pos = -1 rows, interleaved at seeded places


def build_prefill(spec: PrefillSpec) -> tuple[KVTensors, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(kv, q [T, n_q, D], q_seq_idx [T] int32, q_pos [T] int32)``."""
    kv = build_kv(spec.kv)
    rows: list[tuple[int, int]] = []
    for b, (s, n) in enumerate(zip(spec.starts, spec.kv.lens)):
        rows += [(b, p) for p in range(s, n)]
    rng = random.Random(spec.kv.seed)
    for _ in range(spec.pad_rows):
        rows.insert(rng.randrange(len(rows) + 1), (rng.randrange(len(spec.kv.lens)), -1))
    q = build_queries(spec.kv.seed, len(rows), spec.kv.n_q, spec.kv.head_dim, spec.kv.scale_qk)
    qidx = torch.tensor([b for b, _ in rows], dtype=torch.int32)
    qpos = torch.tensor([p for _, p in rows], dtype=torch.int32)
    return kv, q, qidx, qpos
