"""STATE: the state machine of DESIGN section 2; every bad input gets its typed error and changes nothing."""
# ruff: noqa: B023  (failure messages are lambdas called at once, inside the loop)

from __future__ import annotations

import random

import pytest
import torch

from conformance import cases
from conformance.harness import kernels_of, to_kernel
from reference import PartialState, SamplingParams
from reference.errors import (BlockTableError, ConfigError, ContextLimitError, InvalidTokenError, MergeError,
                              SequenceStateError, TurnKVError, UnknownSequenceError)

pytestmark = pytest.mark.clause("STATE")


def _setup(case, scale):
    """An engine holding a paused (P), a waiting (W), a finished-at-the-limit (F) and a collected (C) sequence."""
    bs = case.block_size
    limit = 4 * bs + 8
    V = case.cfg.vocab_size
    rng = random.Random(31)
    eng = case.engine(max_model_len=limit)
    sp = case.sp(temperature=0.0, max_tokens=3, stop_token_ids=())
    ids = {}
    ids["C"] = eng.rollout_add(cases.random_tokens(rng, V, 5), sp)
    ids["P"] = eng.rollout_add(cases.random_tokens(rng, V, bs + 1), sp)
    ids["F"] = eng.rollout_add(cases.random_tokens(rng, V, limit - 2), sp)
    outs = eng.rollout_run_turns()
    case.check(outs[ids["F"]].stop_reason == "context_limit" and outs[ids["F"]].finished,
               lambda: f"a turn reaching max_model_len must stop with 'context_limit', finished: {outs[ids['F']]}")
    eng.rollout_finish(ids["C"])
    ids["W"] = eng.rollout_add(cases.random_tokens(rng, V, 3), sp)
    return eng, ids, limit, V, sp


def test_state_machine(conf, scale, model):
    """waiting -> (run) paused -> (continue) waiting -> paused -> finish; the context limit gives 'finished';
    finish works in every state; run_turns with nothing to run returns {}."""
    case = conf.case(model, "STATE")
    with case.guard():
        eng, ids, limit, V, sp = _setup(case, scale)
        states = {k: eng.state(v) for k, v in ids.items() if k != "C"}
    case.check(states == {"P": "paused", "F": "finished", "W": "waiting"},
               lambda: f"states {states}, expected P paused, F finished, W waiting")
    with case.guard():
        eng.rollout_continue(ids["P"], [1, 2])
        s1 = eng.state(ids["P"])
        out = eng.rollout_run_turns()
        s2, s3 = eng.state(ids["P"]), eng.state(ids["W"])
    case.check(s1 == "waiting", f"after rollout_continue the state is {s1!r}, expected 'waiting'")
    case.check(set(out) == {ids["P"], ids["W"]}, lambda: f"run_turns returned {sorted(out)}, expected P and W")
    case.check(s2 == "paused" and s3 == "paused", f"after run_turns: P {s2!r}, W {s3!r}, expected 'paused'")
    with case.guard():
        empty = eng.rollout_run_turns()
    case.check(empty == {}, lambda: f"run_turns with nothing waiting returned {empty}")
    with case.guard():
        fresh = eng.rollout_add([1, 2, 3], sp)
        t = eng.rollout_finish(fresh)          # finish a sequence that never ran
    case.check(list(t.token_ids) == [1, 2, 3] and t.num_turns == 0 and list(t.assistant_mask) == [0, 0, 0],
               lambda: f"finishing a never-run sequence: {t}")
    for k in ("P", "F", "W"):
        with case.guard():
            tr = eng.rollout_finish(ids[k])
        case.check(tr.seq_id == ids[k], f"rollout_finish({ids[k]}) returned the trajectory of {tr.seq_id}")
        with pytest.raises(TurnKVError):
            eng.state(ids[k])
    case.check(eng.num_free_blocks == eng.num_blocks, "blocks still held after every sequence finished")


def _bad_calls(ids, limit, V, sp):
    P, W, F, C = ids["P"], ids["W"], ids["F"], ids["C"]
    collected = (SequenceStateError, UnknownSequenceError)
    return [
        ("continue unknown id", lambda e: e.rollout_continue(10_000, [1]), UnknownSequenceError),
        ("continue non-int id", lambda e: e.rollout_continue("0", [1]), UnknownSequenceError),
        ("continue bool id", lambda e: e.rollout_continue(True, [1]), UnknownSequenceError),
        ("continue collected id", lambda e: e.rollout_continue(C, [1]), collected),
        ("finish collected id", lambda e: e.rollout_finish(C), collected),
        ("finish unknown id", lambda e: e.rollout_finish(10_000), UnknownSequenceError),
        ("state of unknown id", lambda e: e.state(10_000), UnknownSequenceError),
        ("state of collected id", lambda e: e.state(C), collected),
        ("block_table of unknown id", lambda e: e.block_table(10_000), UnknownSequenceError),
        ("continue a waiting sequence", lambda e: e.rollout_continue(W, [1]), SequenceStateError),
        ("continue a finished sequence", lambda e: e.rollout_continue(F, [1]), SequenceStateError),
        ("observation id = vocab_size", lambda e: e.rollout_continue(P, [1, V]), InvalidTokenError),
        ("observation id -1", lambda e: e.rollout_continue(P, [-1]), InvalidTokenError),
        ("observation float", lambda e: e.rollout_continue(P, [1.5]), InvalidTokenError),
        ("observation bool", lambda e: e.rollout_continue(P, [True]), InvalidTokenError),
        ("observation str", lambda e: e.rollout_continue(P, "abc"), InvalidTokenError),
        ("observation None", lambda e: e.rollout_continue(P, None), InvalidTokenError),
        ("observation nested", lambda e: e.rollout_continue(P, [[1, 2]]), InvalidTokenError),
        ("observation 2-D tensor", lambda e: e.rollout_continue(P, torch.tensor([[1, 2]])), InvalidTokenError),
        ("observation float tensor", lambda e: e.rollout_continue(P, torch.tensor([1.0])), InvalidTokenError),
        ("observation past the context limit", lambda e: e.rollout_continue(P, [1] * limit), ContextLimitError),
        ("prompt empty", lambda e: e.rollout_add([], sp), InvalidTokenError),
        ("prompt id = vocab_size", lambda e: e.rollout_add([V], sp), InvalidTokenError),
        ("prompt id -1", lambda e: e.rollout_add([3, -1], sp), InvalidTokenError),
        ("prompt past the context limit", lambda e: e.rollout_add([1] * limit, sp), ContextLimitError),
        ("sampling params not a SamplingParams", lambda e: e.rollout_add([1, 2], {"temperature": 1.0}), ConfigError),
        ("generate with a flat list", lambda e: e.generate([1, 2, 3], sp), InvalidTokenError),
        ("generate with a bad id", lambda e: e.generate([[1], [V]], sp), InvalidTokenError),
        ("generate past the context limit", lambda e: e.generate([[1], [1] * limit], sp), ContextLimitError),
        ("score empty", lambda e: e.score([]), InvalidTokenError),
        ("score bad id", lambda e: e.score([1, V]), InvalidTokenError),
        ("score past the context limit", lambda e: e.score([1] * (limit + 1)), ContextLimitError),
    ]


def test_bad_inputs_typed_error_state_unchanged(conf, scale, model):
    """Each bad call raises its typed error (reference.errors) with snapshot() and num_free_blocks unchanged;
    afterwards the engine produces exactly the tokens of a clean engine fed only the good calls."""
    case = conf.case(model, "STATE")
    with case.guard():
        eng, ids, limit, V, sp = _setup(case, scale)
    for what, call, err in _bad_calls(ids, limit, V, sp):
        before, free = eng.snapshot(), eng.num_free_blocks
        try:
            call(eng)
        except err:
            pass
        except Exception as e:  # noqa: BLE001
            case.fail(f"{what}: raised {type(e).__name__}: {e}; expected {getattr(err, '__name__', err)}")
        else:
            case.fail(f"{what}: no error raised; expected {getattr(err, '__name__', err)}")
        after = eng.snapshot()
        case.check(after == before and eng.num_free_blocks == free,
                   lambda: f"{what}: the rejected call changed the engine state\nbefore {before}\nafter  {after}")
    with case.guard():
        clean, cids, _, _, _ = _setup(case, scale)
        results = []
        for e, i in ((eng, ids), (clean, cids)):
            e.rollout_continue(i["P"], [4, 5, 6])
            e.rollout_run_turns()
            results.append([list(e.rollout_finish(i[k]).token_ids) for k in ("P", "W", "F")])
    case.check(results[0] == results[1], lambda: (
        f"after rejected calls the engine's tokens differ from a clean engine's\nafter bad calls {results[0]}\n"
        f"clean           {results[1]}"))


def test_bad_sampling_params(conf, scale, model):
    """Invalid SamplingParams are rejected with ConfigError (the shared type validates at construction)."""
    case = conf.case(model, "STATE")
    for kw in (dict(temperature=-1.0), dict(temperature=float("nan")), dict(top_k=-1), dict(top_p=0.0),
               dict(top_p=1.5), dict(max_tokens=0), dict(seed=-1), dict(logprobs_mode="sampled")):
        try:
            SamplingParams(**kw)
        except ConfigError:
            continue
        case.fail(f"SamplingParams(**{kw}) was accepted; expected ConfigError")


def test_generate_does_not_lose_rollout_turns(conf, scale, model):
    """generate() while an agentic sequence waits: its turn is returned by the next rollout_run_turns; a paused
    sequence stays paused with its tokens and blocks untouched."""
    case = conf.case(model, "STATE")
    rng = random.Random(33)
    V = case.cfg.vocab_size
    eng = case.engine()
    sp = case.sp(temperature=0.0, max_tokens=4, stop_token_ids=())
    with case.guard():
        a = eng.rollout_add(cases.random_tokens(rng, V, 7), sp)
        eng.rollout_run_turns()
        table_a = eng.block_table(a)
        b = eng.rollout_add(cases.random_tokens(rng, V, 9), sp)
        eng.generate([cases.random_tokens(rng, V, 5)], sp)
        state_a, table_a2 = eng.state(a), eng.block_table(a)
        outs = eng.rollout_run_turns()
    case.check(state_a == "paused" and table_a2 == table_a,
               lambda: f"generate() disturbed a paused sequence: state {state_a}, table {table_a} -> {table_a2}")
    case.check(b in outs and len(outs[b].token_ids) >= 1, lambda: (
        f"the waiting sequence's turn was lost across generate(): run_turns returned {sorted(outs)}"))
    case.check(a not in outs, "run_turns returned a turn for a paused sequence")


def _guard_cases(n_q, n_kv, D, bs):
    """(what, kernel, args builder) for inputs that must fail the launch guards."""
    spec = cases.KVSpec(seed=5, n_q=n_q, n_kv=n_kv, head_dim=D, block_size=bs, lens=(bs + 1, 2), extra_pages=1)
    kv = cases.build_kv(spec)
    N = spec.num_blocks
    t = kv.block_tables

    def table(mod):
        x = t.clone()
        mod(x)
        return x

    bad_tables = [
        ("page id out of range", table(lambda x: x.__setitem__((0, 0), N))),
        ("negative page id in use", table(lambda x: x.__setitem__((0, 1), -1))),
        ("page twice in one table", table(lambda x: x.__setitem__((0, 1), int(t[0, 0])))),
        ("entry past the sequence's blocks not -1", torch.cat([t, torch.full((2, 1), 0, dtype=t.dtype)], 1)),
    ]
    q = cases.build_queries(5, 2, n_q, D)
    out = []
    for what, tb in bad_tables:
        out.append((f"split_kv_decode: {what}", "split_kv_decode", (q, kv.k_cache, kv.v_cache, tb, kv.seq_lens, 2)))
        out.append((f"split_kv_partials: {what}", "split_kv_partials", (q, kv.k_cache, kv.v_cache, tb, kv.seq_lens, 2)))
    short = t[:, :1].clone()
    out.append(("table too short for seq_len", "split_kv_decode", (q, kv.k_cache, kv.v_cache, short, kv.seq_lens, 2)))
    out.append(("negative seq_len", "split_kv_decode",
                (q, kv.k_cache, kv.v_cache, t, torch.tensor([-1, 2], dtype=torch.int32), 2)))
    qp = cases.build_queries(6, 3, n_q, D)
    qidx = torch.tensor([0, 0, 1], dtype=torch.int32)
    for what, qpos in (("query position not in the cache", torch.tensor([0, bs + 1, 0], dtype=torch.int32)),
                       ("query sequence index out of range", None)):
        if qpos is None:
            args = (qp, kv.k_cache, kv.v_cache, t, kv.seq_lens, torch.tensor([0, 2, 1], dtype=torch.int32),
                    torch.tensor([0, 1, 0], dtype=torch.int32))
        else:
            args = (qp, kv.k_cache, kv.v_cache, t, kv.seq_lens, qidx, qpos)
        out.append((f"paged_prefill: {what}", "paged_prefill", args))
    out.append(("paged_prefill: page id out of range", "paged_prefill",
                (qp, kv.k_cache, kv.v_cache, bad_tables[0][1], kv.seq_lens, qidx,
                 torch.tensor([0, 1, 0], dtype=torch.int32))))
    return out


def test_kernel_guards(conf, scale, model):
    """Bad block tables, sequence lengths and query positions raise BlockTableError before any launch; bad partial
    states raise MergeError; the engine's state is unchanged."""
    case = conf.case(model, "STATE")
    eng = case.engine()
    kern = kernels_of(eng)
    cfg = case.cfg
    case.repro.add(f"# kernel guards: see conformance/test_state.py::_guard_cases({cfg.num_attention_heads}, "
                   f"{cfg.num_key_value_heads}, {cfg.head_dim}, {case.block_size})")
    before = eng.snapshot()
    for what, name, args in _guard_cases(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, case.block_size):
        moved = tuple(to_kernel(a, kern, a.is_floating_point()) if isinstance(a, torch.Tensor) else a for a in args)
        try:
            getattr(kern, name)(*moved)
        except BlockTableError:
            continue
        except Exception as e:  # noqa: BLE001
            case.fail(f"kernels.{name} with {what}: raised {type(e).__name__}: {e}; expected BlockTableError")
        case.fail(f"kernels.{name} with {what}: accepted; expected BlockTableError")
    o = torch.zeros(2, cfg.num_attention_heads, cfg.head_dim)
    lse = torch.zeros(2, cfg.num_attention_heads)
    dev = getattr(kern, "device", "cpu")
    st = lambda i, oo=o, ll=lse: PartialState(oo.to(dev), ll.to(dev), i)  # noqa: E731
    for what, states in (("no states", []), ("duplicate global_block_index", [st(0), st(1), st(1)]),
                         ("shape mismatch", [st(0), st(1, o[:1], lse[:1])])):
        try:
            kern.merge_states(states)
        except MergeError:
            continue
        except Exception as e:  # noqa: BLE001
            case.fail(f"kernels.merge_states with {what}: raised {type(e).__name__}: {e}; expected MergeError")
        case.fail(f"kernels.merge_states with {what}: accepted; expected MergeError")
    case.check(eng.snapshot() == before, "a rejected kernel call changed the engine state")
