"""Agentic workload: many sequences, several turns of (observation, generation), greedy, fixed lengths.

Turn ``k`` (1-based) appends observation ``k`` (random tokens, the same in every variant) and
generates ``GEN`` tokens; turn 1's observation follows the prompt, so the first prefill is
``PROMPT + OBS`` tokens and each resumed turn prefills ``1 + OBS`` (the pending token and the
observation). Four variants, each timed turn by turn (host wall clock with a device sync):

(a) ``resume``: the engine keeps each sequence's KV across turns (``rollout_continue``);
(b) ``re-prefill``: the engine starts a fresh sequence on the whole context every turn;
(c) ``transformers + cache``: ``generate`` with the full ``input_ids`` and the ``DynamicCache``
    of the previous turn (``past_key_values``, from ``return_dict_in_generate=True``);
(d) ``transformers re-prefill``: ``generate`` on the whole context every turn.

Checked: every resumed turn of (a) prefilled exactly ``1 + OBS`` tokens and every turn produced
``GEN`` tokens; turn 1 of (a) and (b) (the same computation) agree; the engine's first tokens
agree with transformers' (same weights). Reported: the wall times, speedups, and the time of
each turn (a resumed turn's cost must not grow with the context: turn-8 / turn-1 <= 1.3).

``test_agentic_trickle`` (group ``agentic_trickle``, not an issue target): the same sequences with their
observations handed over a few at a time, as tool calls that return at different moments, the optimized engine's
short prefill steps eager and replayed from prefill graphs (``Workload.trickle``).
"""

from __future__ import annotations

import random

import pytest
import torch

from _bench import (Scale, Stopwatch, agreement, alloc_retries, free_cuda, hf_generate, hf_model, kv_bytes_per_token,
                    make_engine, model_weights, run_or_out_of_memory, skip_out_of_memory, weight_bytes_per_step)
from reference import ModelConfig, SamplingParams, named_config

GROUP = "agentic"
TURNS_GROUP = "agentic_turns"
TRICKLE_GROUP = "agentic_trickle"

# ---------------------------------------------------------------- problem sizes (one table)
MODEL = {"cpu": "tiny", "gpu": "qwen3-0.6b"}
SEQS = {"cpu": 4, "gpu": 64}
PROMPT = {"cpu": 24, "gpu": 1024}
TURNS = {"cpu": 3, "gpu": 8}
OBS = {"cpu": 8, "gpu": 256}
GEN = {"cpu": 4, "gpu": 128}
ENGINE_KW = {"cpu": dict(block_size=8, max_num_batched_tokens=512),
             "gpu": dict(block_size=16, max_num_batched_tokens=16384)}
# the fewest sequences a transformers generate call may take where one call over all of them runs out of device memory
# (the peer then runs in sub-batches, halved until they fit; below this it is reported as out of memory, not timed)
MIN_CHUNK = {"cpu": 1, "gpu": 8}
WARM_GEN = 3                                # tokens per turn of the warm-up run (2 turns), which is also checked
VARIANTS = ("resume", "re-prefill", "transformers + cache", "transformers re-prefill")
#: the trickle (``Workload.trickle``): turns, observation tokens handed over, engine steps after each hand-over
TRICKLE = {"cpu": dict(turns=3, obs_len=5, steps=2), "gpu": dict(turns=3, obs_len=31, steps=2)}
TRICKLE_GROUPS = (1, 4)                     # sequences a hand-over
#: the trickle's variants: ``runner.prefill_graph_max_tokens`` (the optimized engine's; 0: every prefill step eager)
TRICKLE_VARIANTS = {"eager prefill": 0, "prefill graphs": 256}


def turn_floors(cfg: ModelConfig, copy_GBps: float, gemm_TFLOPs: float, seqs: int, prompt: int, obs: int, gen: int,
                turns: int, elem: int = 2) -> list[dict[str, float]]:
    """The fewest seconds each turn of the resumed workload can take at the run's ceilings.

    After turn ``k``'s prefill (0-based) a sequence holds ``C_k = prompt + (k + 1) obs + k gen`` tokens; turn 0
    prefilled ``prompt + obs`` of them, a resumed turn ``1 + obs`` (the pending token and the observation). Its
    ``gen - 1`` decode steps then attend over ``C_k + 1`` ... ``C_k + gen - 1`` keys. A decode step reads every
    weight and each sequence's K/V once: ``(W + seqs * keys * kv_bytes) / copy`` (the engine decode bench's
    roofline). A prefill step is held to the larger of its FLOPs at the GEMM rate (every linear weight twice per
    token, the LM head once per sequence, ``4 * heads * head_dim`` a layer per query-key pair of the causal
    attention: the scores and P V) and its weights at the copy rate.
    """
    bw, rate = copy_GBps * 1e9, gemm_TFLOPs * 1e12
    W, kvt = weight_bytes_per_step(cfg, elem), kv_bytes_per_token(cfg, elem)
    head = cfg.vocab_size * cfg.hidden_size                        # LM head parameters
    linear = W // elem - head                                      # the layers' parameters (norms included)
    qk = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim   # a query-key pair, all layers
    out = []
    for k in range(turns):
        cached = prompt + (k + 1) * obs + k * gen                  # C_k
        new = prompt + obs if k == 0 else 1 + obs                  # tokens this turn's prefill adds
        start = cached - new                                       # the prefix they attend to
        pairs = new * start + new * (new + 1) // 2                 # causal query-key pairs of one sequence
        flops = seqs * (2 * linear * new + 2 * head + qk * pairs)
        prefill = max(flops / rate, W / bw)
        decode = sum((W + seqs * (cached + j) * kvt) / bw for j in range(1, gen))
        out.append({"prefill_s": prefill, "decode_s": decode, "floor_s": prefill + decode, "context": cached,
                    "prefilled": new, "first_keys": cached + 1, "last_keys": cached + gen - 1})
    return out


def pytest_generate_tests(metafunc):
    if "variant" in metafunc.fixturenames:
        metafunc.parametrize("variant", VARIANTS)
    if "trickle_variant" in metafunc.fixturenames:
        metafunc.parametrize("group", TRICKLE_GROUPS)
        metafunc.parametrize("trickle_variant", list(TRICKLE_VARIANTS))


def set_prefill_graphs(eng, tokens: int) -> int | None:
    """Set the optimized runner's ``prefill_graph_max_tokens`` to ``tokens``; returns the value before (``None``: the
    engine has no prefill graphs, as the reference at the CPU scale, and nothing is set)."""
    runner = getattr(eng, "runner", None)
    if not hasattr(runner, "prefill_graph_max_tokens"):
        return None
    before, runner.prefill_graph_max_tokens = runner.prefill_graph_max_tokens, tokens
    return before


def prefill_graph_steps(eng) -> int:
    """The prefill steps the engine's runner has replayed from prefill graphs so far (0 for an engine without)."""
    return getattr(getattr(eng, "runner", None), "prefill_graph_steps", 0)


def workload_tokens(s: str, vocab: int) -> tuple[list[list[int]], list[list[list[int]]]]:
    """Scale ``s``'s prompts (one a sequence) and observations (one a sequence and turn): seeded random token ids."""
    rng = random.Random(5)
    prompts = [[rng.randrange(vocab) for _ in range(PROMPT[s])] for _ in range(SEQS[s])]
    obs = [[[rng.randrange(vocab) for _ in range(OBS[s])] for _ in range(TURNS[s])] for _ in range(SEQS[s])]
    return prompts, obs


def engine_pool(s: str) -> tuple[int, int]:
    """Scale ``s``'s ``max_model_len`` (the whole rollout and two blocks, in whole blocks) and ``num_blocks`` (every
    sequence at that length, and 8 more)."""
    bs = ENGINE_KW[s]["block_size"]
    total = PROMPT[s] + TURNS[s] * (OBS[s] + GEN[s])
    max_len = -(-(total + 2 * bs) // bs) * bs
    return max_len, SEQS[s] * (max_len // bs) + 8


class Workload:
    def __init__(self, scale: Scale) -> None:
        s = self.s = scale.name
        self.scale = scale
        self.cfg = named_config(MODEL[s])
        self.prompts, self.obs = workload_tokens(s, self.cfg.vocab_size)
        self.sp = SamplingParams(temperature=0.0, max_tokens=GEN[s], stop_token_ids=(), logprobs=True)
        self.max_len, self.num_blocks = engine_pool(s)
        self.weights = model_weights(self.cfg, torch.bfloat16 if scale.gpu else torch.float32)
        self._engine = self._hf = None
        self.out: dict[str, dict] = {}          # variant -> {"turn_s": [...], "tokens": [[turn tokens]]}
        self.warm: dict[str, dict] = {}         # the same for the warm-up runs

    # the engine and transformers' model never share the card: each one's memory is released before the other is
    # built, so each runs as it would in a process of its own (on an 80 GB card, transformers' re-prefill of 64
    # contexts of up to 3.7k tokens does not fit beside the engine's KV pool)
    def engine(self):
        if self._engine is None:
            self.release_hf()
            s = self.s
            self._engine = make_engine(self.scale, self.cfg, self.weights, max_num_seqs=SEQS[s], max_model_len=self.max_len,
                                       num_blocks=self.num_blocks,
                                       **ENGINE_KW[s])
        return self._engine

    def hf(self):
        if self._hf is None:
            self.release_engine()
            self._hf = hf_model(self.cfg, self.weights, self.scale)
        return self._hf

    # ------------------------------------------------------------------ the four variants
    def resume(self, turns: int, sp: SamplingParams) -> dict:
        eng = self.engine()
        n = len(self.prompts)
        times, toks, prefilled = [], [[] for _ in range(n)], []
        sids = [eng.rollout_add(p + o[0], sp) for p, o in zip(self.prompts, self.obs)]
        for k in range(turns):
            with Stopwatch(self.scale) as sw:
                if k:
                    for sid, o in zip(sids, self.obs):
                        eng.rollout_continue(sid, o[k])
                outs = eng.rollout_run_turns()
            times.append(sw.wall_s)
            for i, sid in enumerate(sids):
                toks[i].append(outs[sid].token_ids)
            prefilled.append([outs[sid].prefilled_tokens for sid in sids])
        for sid in sids:
            eng.rollout_finish(sid)
        return {"turn_s": times, "tokens": toks, "prefilled": prefilled}

    def reprefill(self, turns: int, sp: SamplingParams) -> dict:
        eng = self.engine()
        ctx = [p + o[0] for p, o in zip(self.prompts, self.obs)]
        times, toks = [], [[] for _ in ctx]
        for k in range(turns):
            with Stopwatch(self.scale) as sw:
                sids = [eng.rollout_add(c, sp) for c in ctx]
                outs = eng.rollout_run_turns()
                for sid in sids:
                    eng.rollout_finish(sid)
            times.append(sw.wall_s)
            for i, sid in enumerate(sids):
                toks[i].append(outs[sid].token_ids)
                if k + 1 < turns:
                    ctx[i] = ctx[i] + outs[sid].token_ids + self.obs[i][k + 1]
        return {"turn_s": times, "tokens": toks}

    def peer_inputs(self, turns: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """transformers' inputs on the scale's device: turn 1's ids (every prompt and its first observation,
        ``[n, PROMPT + OBS]``) and each of ``turns`` turns' observations (``[n, OBS]`` each)."""
        dev = self.scale.device
        obs = [torch.tensor([o[k] for o in self.obs], dtype=torch.long, device=dev) for k in range(turns)]
        return torch.cat([torch.tensor(self.prompts, dtype=torch.long, device=dev), obs[0]], 1), obs

    def transformers(self, turns: int, gen: int, reuse: bool, chunk: int | None = None) -> dict:
        """``generate`` over every sequence each turn; ``chunk``: that many sequences a call, the calls one after another
        (each sub-batch keeps its own cache across turns), for a card where one call over all of them does not fit."""
        hf = self.hf()
        n = len(self.prompts)
        size = chunk or n
        parts = [slice(i, min(n, i + size)) for i in range(0, n, size)]
        full, obs = self.peer_inputs(turns)
        ids = [full[p] for p in parts]
        caches: list = [None] * len(parts)
        times, toks = [], [[] for _ in self.prompts]
        for k in range(turns):
            seqs = []
            with Stopwatch(self.scale) as sw:
                for j in range(len(parts)):
                    out, new_cache = hf_generate(hf, ids[j], gen, cache=caches[j])
                    caches[j] = new_cache if reuse else None    # (re-prefill: the cache is dropped at once)
                    seqs.append(out)
            times.append(sw.wall_s)
            for p, out in zip(parts, seqs):
                for i, t in zip(range(p.start, p.stop), out[:, -gen:].tolist()):
                    toks[i].append(t)
            if k + 1 < turns:
                ids = [torch.cat([out, obs[k + 1][p]], 1) for p, out in zip(parts, seqs)]
        return {"turn_s": times, "tokens": toks, "sub_batches": len(parts)}

    def trickle(self, eng, turns: int, obs_len: int, group: int, steps: int, gen: int) -> dict:
        """The sequences with their observations arriving a few at a time, as tool calls that return at different
        moments: turn 1 as the bench's; in each later turn the first ``obs_len`` tokens of each sequence's observation
        are handed over ``group`` sequences at a time, and ``steps`` engine steps run after each hand-over (the
        scheduler runs prefill first, so the first of them is the hand-over's prefill step of ``group * (1 +
        obs_len)`` tokens while the others wait), then the turn runs out. Returns the wall time (s, device synced),
        the process's CPU time and the garbage collector's time over it (``Stopwatch``), every turn's tokens per
        sequence and the count of hand-overs; every sequence must produce ``gen`` tokens a turn."""
        sp = SamplingParams(temperature=0.0, max_tokens=gen, stop_token_ids=(), logprobs=True)
        toks: dict[int, list[list[int]]] = {}
        hand_overs = 0
        with Stopwatch(self.scale) as sw:
            sids = [eng.rollout_add(p + o[0], sp) for p, o in zip(self.prompts, self.obs)]
            for sid, o in eng.rollout_run_turns().items():
                toks.setdefault(sid, []).append(o.token_ids)
            for k in range(1, turns):
                for g in range(0, len(sids), group):
                    for i in range(g, min(g + group, len(sids))):
                        eng.rollout_continue(sids[i], self.obs[i][k][:obs_len])
                    hand_overs += 1
                    for sid, o in eng.rollout_run_turns(max_steps=steps).items():
                        toks.setdefault(sid, []).append(o.token_ids)
                for sid, o in eng.rollout_run_turns().items():
                    toks.setdefault(sid, []).append(o.token_ids)
        for sid in sids:
            eng.rollout_finish(sid)
        got = [toks.get(sid, []) for sid in sids]
        assert all(len(ts) == turns and all(len(x) == gen for x in ts) for ts in got), "trickle: wrong lengths"
        return {"wall_s": sw.wall_s, "cpu_s": sw.cpu_s, "gc_s": sw.gc_s, "gc_collections": list(sw.gc.collections),
                "tokens": got, "hand_overs": hand_overs}

    def run(self, variant: str, chunk: int | None = None) -> dict:
        """The timed run of ``variant``, with the caching allocator's retries over it (``alloc_retries``)."""
        s = self.s
        before = alloc_retries(self.scale)
        if variant == "resume":
            out = self.resume(TURNS[s], self.sp)
        elif variant == "re-prefill":
            out = self.reprefill(TURNS[s], self.sp)
        else:
            out = self.transformers(TURNS[s], GEN[s], reuse=variant == "transformers + cache", chunk=chunk)
        out["alloc_retries"] = None if before is None else alloc_retries(self.scale) - before
        return out

    def warm_up(self, variant: str, chunk: int | None = None) -> dict:
        """Compile kernels and capture the CUDA graphs of the workload's shapes (2 short turns)."""
        sp = SamplingParams(temperature=0.0, max_tokens=WARM_GEN, stop_token_ids=())
        if variant == "resume":
            return self.resume(2, sp)
        if variant == "re-prefill":
            return self.reprefill(2, sp)
        return self.transformers(2, WARM_GEN, reuse=variant == "transformers + cache", chunk=chunk)

    def release_engine(self) -> None:
        if self._engine is not None:
            self._engine = None
            free_cuda()

    def release_hf(self) -> None:
        if self._hf is not None:
            self._hf = None
            free_cuda()

    def close(self) -> None:
        self._engine = self._hf = self.weights = None
        free_cuda()


@pytest.fixture(scope="module")
def work(scale: Scale, results, ceilings):
    # ``ceilings`` is asked for here so that the session measures them before this module's runs, as every other bench
    # does: measured after them (when only ``test_agentic_targets`` asked), the fifty-second session's two H100 runs
    # read copies at 2573-2599 GB/s against 2967-3026 GB/s in every earlier H100 run, and put the engine above its floor
    s = scale.name
    results.describe(GROUP, f"Agentic workload: {SEQS[s]} sequences, prompt {PROMPT[s]}, {TURNS[s]} turns of "
                            f"(observation {OBS[s]}, generation {GEN[s]}), {MODEL[s]}", columns=[
        ("variant", "variant", ""), ("wall_s", "wall s", ".4g"), ("x_engine", "x slower than resume", ".2f"),
        ("speedup_vs_hf_cache", "resume speedup", ".2f"), ("turn1_s", "turn 1 s", ".4g"), ("turn2_s", "turn 2 s", ".4g"),
        ("turnN_s", "last turn s", ".4g"), ("floor_s", "floor s", ".4g"), ("pct_floor", "% of floor", ".1f"),
        ("last_over_first", "last / turn 1", ".3f"),
        ("last_over_second", "last / turn 2", ".3f"), ("tokens_per_s", "generated tok/s", ".5g"),
        ("agree_first", "turn-1 first tokens = resume", ".2f"), ("agree_prefix", "matched prefix vs resume", ".2f"),
        ("seqs_per_call", "sequences a generate call", ""), ("alloc_retries", "allocator retries", ""),
        ("out_of_memory", "not timed: out of memory", "")])
    results.describe(TURNS_GROUP, "Agentic workload: time of each turn", columns=[
        ("turn", "turn", ""), ("variant", "variant", ""), ("turn_s", "seconds", ".4g"), ("context", "context at start", ""),
        ("prefilled", "tokens prefilled", "")],
        plots=[dict(x="turn", y="turn_s", series="variant", logy=True, ylabel="seconds", title="time per turn")])
    t = TRICKLE[s]
    results.describe(TRICKLE_GROUP, f"Agentic workload, observations trickling in ({MODEL[s]})", columns=[
        ("variant", "prefill steps", ""), ("group", "sequences a hand-over", ""),
        ("step_tokens", "tokens a hand-over's prefill", ""), ("hand_overs", "hand-overs", ""),
        ("wall_s", "wall s", ".4g"), ("speedup", "eager / this", ".3f"), ("cpu_s", "process CPU s", ".4g"),
        ("gc_s", "GC s", ".3g"), ("gc_gen2", "full GCs", ""),
        ("graphed_steps", "graphed prefill steps", ""), ("agree", "matched prefix vs eager", ".3f")],
        plots=[dict(x="group", y="wall_s", series="variant", ylabel="seconds", xlabel="sequences a hand-over",
                    title="whole run")])
    results.note(TRICKLE_GROUP, f"{SEQS[s]} sequences, prompt {PROMPT[s]} + observation {OBS[s]}, {t['turns']} turns of "
                                f"{GEN[s]} greedy tokens; in turns 2-{t['turns']} each sequence gets {t['obs_len']} "
                                f"observation tokens, handed over a few sequences at a time, {t['steps']} engine steps "
                                f"after each hand-over, then the turn runs out (`Workload.trickle`).")
    w = Workload(scale)
    yield w
    w.close()


def _check(work: Workload, variant: str, out: dict, turns: int, gen: int, base: dict | None) -> dict:
    """Fixed lengths, delta-only prefill on resume, and agreement with the resumed engine's tokens."""
    s = work.s
    toks = out["tokens"]
    assert all(len(seq) == turns for seq in toks), f"{variant}: not every sequence ran {turns} turns"
    assert all(len(t) == gen for seq in toks for t in seq), f"{variant}: a turn did not generate {gen} tokens"
    if "prefilled" in out:
        for k, pf in enumerate(out["prefilled"][1:], start=2):
            assert all(p == OBS[s] + 1 for p in pf), (f"{variant}, turn {k}: resumed sequences prefilled {set(pf)} tokens, "
                                                      f"expected pending + observation = {OBS[s] + 1}")
    if base is None or base is out:
        return {}
    first = agreement([seq[0] for seq in base["tokens"]], [seq[0] for seq in toks])
    flat = agreement([sum(seq, []) for seq in base["tokens"]], [sum(seq, []) for seq in toks])
    need = 0.9 if variant == "re-prefill" else 0.5     # turn 1 of re-prefill is the same computation as resume's
    assert first["first_token"] >= need, (
        f"{variant}: turn-1 first tokens agree with the resumed engine on only {first['first_token']:.0%} of sequences")
    return {"agree_first": first["first_token"], "agree_prefix": flat["prefix_share"]}


def test_agentic(benchmark, scale: Scale, results, work: Workload, variant: str):
    s = scale.name
    out: dict = {}
    seqs_per_call = None                                   # (transformers: the sequences a generate call took)

    def warm_up(chunk: int | None) -> None:
        work.warm[variant] = warm = work.warm_up(variant, chunk)             # checked before anything is timed
        _check(work, variant, warm, 2, WARM_GEN, work.warm.get("resume"))

    if variant.startswith("transformers"):
        # A peer that does not fit on this card in one generate call over every sequence runs in sub-batches, halved
        # until they fit, down to MIN_CHUNK; below that it is reported as out of memory, not timed. pytest-benchmark
        # times one call only, so that call holds every attempt, each with its warm-up: its time is not the table's,
        # which is the completed run's turns (``Stopwatch``).
        tried: list[tuple[int | None, str]] = []           # (sequences a call, the error) of each attempt that failed

        def warmed_run(chunk: int | None) -> dict:
            warm_up(chunk)
            return work.run(variant, chunk)

        def attempts() -> None:
            chunk = None
            while chunk is None or chunk >= MIN_CHUNK[s]:
                res, oom = run_or_out_of_memory(lambda c=chunk: warmed_run(c))
                if oom is None:
                    out.update(res)
                    return
                tried.append((chunk, oom))
                chunk = (chunk or SEQS[s]) // 2

        benchmark.pedantic(attempts, rounds=1, iterations=1, warmup_rounds=0)
        if not out:
            work.release_hf()
            last, oom = tried[-1]
            skip_out_of_memory(results, GROUP, scale, variant, f"{oom}, in sub-batches of {last} too" if last else oom,
                               variant=variant)
        seqs_per_call = SEQS[s] // out["sub_batches"]
        if tried:
            where = torch.cuda.get_device_name() if scale.gpu else "the CPU"
            results.note(GROUP, f"{variant}: one generate call over the {SEQS[s]} sequences ran out of device memory on "
                                f"{where} ({tried[0][1]}); it ran as {out['sub_batches']} sub-batches of "
                                f"{seqs_per_call} sequences, one after another, every turn.")
    else:
        warm_up(None)
        benchmark.pedantic(lambda: out.update(work.run(variant)), rounds=1, iterations=1, warmup_rounds=0)
    work.out[variant] = out
    agree = _check(work, variant, out, TURNS[s], GEN[s], work.out.get("resume"))
    t = out["turn_s"]
    rec = {"variant": variant, "wall_s": sum(t), "turn1_s": t[0], "turn2_s": t[1] if len(t) > 1 else None,
           "turnN_s": t[-1], "last_over_first": t[-1] / t[0], "last_over_second": t[-1] / t[1] if len(t) > 1 else None,
           "tokens_per_s": SEQS[s] * TURNS[s] * GEN[s] / sum(t), "turn_s": t, **agree,
           "seqs_per_call": seqs_per_call, "alloc_retries": out["alloc_retries"]}
    if "resume" in work.out and variant != "resume":
        rec["x_engine"] = sum(t) / sum(work.out["resume"]["turn_s"])
    results.add(GROUP, **rec)
    ctx = PROMPT[s] + OBS[s]
    for k, ts in enumerate(t):
        pre = (OBS[s] + 1 if k else ctx) if variant in ("resume", "transformers + cache") else ctx + k * (GEN[s] + OBS[s])
        results.add(TURNS_GROUP, turn=k + 1, variant=variant, turn_s=ts, context=ctx + k * (GEN[s] + OBS[s]),
                    prefilled=pre)
    benchmark.extra_info.update({"wall_s": sum(t), "turn_s": t})


def _sub_batches(out: dict) -> str:
    """The detail's words for a transformers run split into sub-batches (none where one call took every sequence)."""
    k = out.get("sub_batches", 1)
    return f" (in {k} sub-batches: one call over every sequence ran out of device memory)" if k > 1 else ""


def test_agentic_targets(scale: Scale, ceilings, results, work: Workload):
    """Targets of issue 5 (reported): resume >= 20x faster than transformers with cache reuse; last/first turn <= 1.3.
    Beside them, the workload's floor at this run's ceilings (``turn_floors``), which bounds both."""
    a, c = work.out.get("resume"), work.out.get("transformers + cache")
    if a is None:
        pytest.skip("the resumed variant did not run")
    s = scale.name
    t = a["turn_s"]
    ta = sum(t)
    floors = turn_floors(work.cfg, ceilings["copy_GBps"], ceilings["gemm_TFLOPs"], SEQS[s], PROMPT[s], OBS[s], GEN[s],
                         TURNS[s], elem=2 if scale.gpu else 4)
    assert len(floors) == len(t) and all(f["floor_s"] > 0 for f in floors)
    floor = sum(f["floor_s"] for f in floors)
    for r in results.group(GROUP).records:
        if r["variant"] == "resume":
            r |= {"floor_s": floor, "pct_floor": 100 * floor / ta, "turn_floor_s": [f["floor_s"] for f in floors]}
            if c is not None:
                r["speedup_vs_hf_cache"] = sum(c["turn_s"]) / ta
    for k, f in enumerate(floors):
        results.add(TURNS_GROUP, turn=k + 1, variant="floor (resume)", turn_s=f["floor_s"], context=f["context"],
                    prefilled=f["prefilled"])
    results.note(GROUP, f"Floor: the resumed workload at this run's ceilings (copy {ceilings['copy_GBps']:.0f} GB/s, GEMM "
                        f"{ceilings['gemm_TFLOPs']:.3g} TFLOP/s): each decode step's weights and K/V at the copy rate, each "
                        f"prefill's FLOPs at the GEMM rate (`turn_floors`); {floor:.3g} s in all, turn 1 "
                        f"{floors[0]['floor_s']:.3g} s, turn {TURNS[s]} {floors[-1]['floor_s']:.3g} s.")
    results.target(GROUP, "agentic wall time: transformers with cache reuse / engine resuming",
                   sum(c["turn_s"]) / ta if c else None, 20, unit="x",
                   detail=(f"engine {ta:.3g} s, transformers {sum(c['turn_s']):.3g} s{_sub_batches(c)}; at the floor "
                           f"({floor:.3g} s) the engine would be {sum(c['turn_s']) / floor:.3g}x this peer" if c
                           else "transformers did not run"))
    ratio = floors[-1]["floor_s"] / floors[0]["floor_s"]
    results.target(GROUP, f"resumed turn cost: turn {TURNS[s]} / turn 1", t[-1] / t[0], 1.3, op="<=",
                   detail=f"{t[-1]:.3f} s / {t[0]:.3f} s; turn {TURNS[s]} / turn 2 = {t[-1] / t[1]:.2f} "
                          f"(turn 1 also prefills the {PROMPT[s]}-token prompt); the two turns' floors are in a ratio of "
                          f"{ratio:.2f}")


def test_agentic_trickle(benchmark, scale: Scale, results, work: Workload, group: int, trickle_variant: str):
    """The workload's sequences with their observations handed over ``group`` at a time (``Workload.trickle``): each
    hand-over is a short prefill step while the others wait, eager or replayed from the optimized runner's prefill
    graphs (``TRICKLE_VARIANTS``; the same engine, the switch set for the run). One untimed run first (it captures
    the graphs), then the timed one. Checked: every sequence's lengths, turn 1 (a long prefill, eager in both) the
    same tokens as the eager variant's, and on the GPU scale the graphed variant's short steps replayed. The share of
    later tokens equal to the eager variant's is reported (a graphed step is padded to its bucket: no contract fixes
    its bits in bf16). On the CPU scale the engine is the reference, which has no prefill graphs, so the two variants
    are the same engine there (a check of the harness)."""
    s = scale.name
    t = TRICKLE[s]
    eng = work.engine()
    default = set_prefill_graphs(eng, TRICKLE_VARIANTS[trickle_variant])
    if default is None:
        results.note(TRICKLE_GROUP, f"The {type(eng).__module__} engine has no prefill graphs: both variants ran the "
                                    "same engine the same way (a check of the harness, not of the graphs).")
    try:
        work.trickle(eng, t["turns"], t["obs_len"], group, t["steps"], GEN[s])           # warm-up: the captures
        before = prefill_graph_steps(eng)
        out: dict = {}
        benchmark.pedantic(lambda: out.update(work.trickle(eng, t["turns"], t["obs_len"], group, t["steps"], GEN[s])),
                           rounds=1, iterations=1, warmup_rounds=0)
        graphed = prefill_graph_steps(eng) - before
    finally:
        if default is not None:
            set_prefill_graphs(eng, default)
    work.out[("trickle", group, trickle_variant)] = out
    rec = {"variant": trickle_variant, "group": group, "step_tokens": min(group, SEQS[s]) * (1 + t["obs_len"]),
           "hand_overs": out["hand_overs"], "wall_s": out["wall_s"], "cpu_s": out["cpu_s"], "gc_s": out["gc_s"],
           "gc_gen2": out["gc_collections"][2], "graphed_steps": graphed}
    base = work.out.get(("trickle", group, "eager prefill"))
    if base is not None:
        assert [seq[0] for seq in out["tokens"]] == [seq[0] for seq in base["tokens"]], \
            f"trickle ({trickle_variant}, {group} a hand-over): turn 1 differs from the eager variant's"
        rec["agree"] = agreement([sum(seq[1:], []) for seq in base["tokens"]],
                                 [sum(seq[1:], []) for seq in out["tokens"]])["prefix_share"]
        rec["speedup"] = base["wall_s"] / out["wall_s"]
    if scale.gpu and TRICKLE_VARIANTS[trickle_variant] > 0:
        assert graphed >= out["hand_overs"], f"trickle ({group} a hand-over): the hand-overs' prefill steps not graphed"
    results.add(TRICKLE_GROUP, **rec)
    benchmark.extra_info.update({k: v for k, v in rec.items() if k != "variant"})
