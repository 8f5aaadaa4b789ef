"""Meta-tests of the harness: the tolerance rule, the clause markers and table, the engine loader, the failure
template, and deliberately broken engines each caught by the right clause."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conformance import cases, clauses, engines, oracles
from conformance.conftest import clause_errors
from conformance.harness import FAILURE_TAG, Repro, failure_message
from conformance.meta import broken
from conformance.tolerance import (ACCUM_FLOOR_STEPS, ErrorStats, RuleCheck, logit_bound, noise_bound, share_floor,
                                  ulp)
from reference.types import SamplingParams
from reference.weights import random_weights

pytestmark = pytest.mark.meta
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _only_on_the_reference(conf):
    if conf.spec != "reference" and not os.environ.get("TURNKV_CONFORMANCE_META"):
        pytest.skip("harness meta-tests run with --engine reference (or TURNKV_CONFORMANCE_META=1)")


def _pytest(*args: str, env_extra: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (engines.ENV_VAR, "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TURNKV_CONFORMANCE_THREADS", "1")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "pytest", "conformance", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------------- the tolerance rule


def test_ulp():
    assert ulp(torch.float32, 1.0) == 2.0 ** -23
    assert ulp(torch.float32, 3.99) == 2.0 ** -22
    assert ulp("bfloat16", 3.9) == 2.0 ** -6
    assert ulp("bf16", 4.0) == 2.0 ** -5
    assert ulp(torch.float16, 1.5) == 2.0 ** -10
    assert ulp(torch.bfloat16, -0.3) == 2.0 ** -9        # magnitude: |x| in [0.25, 0.5)
    assert ulp(torch.bfloat16, 0.0) > 0


def test_logit_rule_arithmetic():
    assert logit_bound(0.01, 3.9, torch.bfloat16) == pytest.approx(0.02 + 2.0 ** -6)
    assert logit_bound(0.0, 3.9, torch.float32) == 2.0 ** -22     # float32: the reference itself, one rounding step
    assert noise_bound(0.1, 3.9) == pytest.approx(0.1 + ACCUM_FLOOR_STEPS * 2.0 ** -22)


def test_share_floor_is_three_binomial_sd_below_the_expectation():
    # the qwen3-0.6b ORACLE run that motivated it: 101 decisive of 345 (29.3%) against an expected 30%
    assert share_floor(0.3, 345) == pytest.approx(0.3 - 3 * (0.3 * 0.7 / 345) ** 0.5)
    assert 0.22 < share_floor(0.3, 345) < 101 / 345
    assert share_floor(0.9, 10_000) == pytest.approx(0.891)          # tight with many steps
    assert share_floor(0.3, 1) == 0.0                                 # never negative
    assert share_floor(0.3, 0) == 0.3                                 # an empty tally cannot pass
    assert share_floor(1.0, 50) == 1.0                                # an expectation of all steps stays all


def test_rule_check_max_and_mean():
    oracle = torch.full((4, 8), 3.0)
    ref = oracle.clone()
    ref[0, 0] += 0.01                                    # reference: max 0.01, mean 0.01/32
    step = 2.0 ** -6                                      # ulp(bf16, 3.0)
    ok = oracle.clone()
    ok[0, 0] += 2 * 0.01 + step                           # exactly at the max bound
    rule = RuleCheck.of(ErrorStats.of(ok, oracle), ErrorStats.of(ref, oracle), torch.bfloat16)
    assert rule.ok, rule.describe()
    too_big = oracle.clone()
    too_big[0, 0] += 2 * 0.01 + 1.5 * step
    assert not RuleCheck.of(ErrorStats.of(too_big, oracle), ErrorStats.of(ref, oracle), torch.bfloat16).ok
    spread = oracle + 0.9 * (2 * 0.01 + step)             # every entry just under the max bound: the mean rule fails
    assert not RuleCheck.of(ErrorStats.of(spread, oracle), ErrorStats.of(ref, oracle), torch.bfloat16).ok
    nan = oracle.clone()
    nan[1, 1] = float("nan")
    assert not RuleCheck.of(ErrorStats.of(nan, oracle), ErrorStats.of(ref, oracle), torch.bfloat16).ok


def test_decisive_steps():
    row = torch.tensor([0.0, 1.0, 0.5, -2.0])
    greedy = SamplingParams(temperature=0.0)
    assert oracles.decide(row, greedy, 5, 0.4).decisive          # margin 0.5 > 0.4
    assert not oracles.decide(row, greedy, 5, 0.6).decisive      # margin 0.5 < 0.6
    peaked = torch.tensor([0.0, 30.0, 0.0, 0.0])
    hot = SamplingParams(temperature=1.0, seed=3)
    d = oracles.decide(peaked, hot, 7, 0.1)
    assert d.token == 1 and d.decisive
    flat = torch.zeros(64)
    assert not oracles.decide(flat, hot, 7, 0.1).decisive        # exact ties everywhere: any noise can flip it
    # top-k boundary: entries 2 and 3 tie for the k-th place within the noise -> not robust if it can matter
    edge = torch.tensor([5.0, 4.0, 1.0, 0.999] + [-10.0] * 4)
    topk = SamplingParams(temperature=1.0, top_k=3, seed=11)
    assert oracles.decide(edge, topk, 2, 0.0).decisive
    assert oracles.decide(edge, topk, 2, 1e-6).token == oracles.decide(edge, topk, 2, 0.0).token


def test_free_running_reanchors():
    """The free-running ORACLE comparison: follows equal tokens, re-anchors the oracle on the engine's tokens after a
    divergence at a non-decisive step, fails at a decisive divergence or a different end; counts every step."""
    from conformance.harness import free_running_tally
    from reference.oracle import OracleTurn

    class Caught(Exception):
        pass

    def fail(what):
        raise Caught(what)

    case = SimpleNamespace(fail=fail)
    sp = SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=(9,))

    def oracle(*turns):
        calls = []

        def run(ctx, sp_):
            calls.append((list(ctx), sp_.max_tokens))
            return turns[len(calls) - 1]
        return run, calls

    run, calls = oracle(OracleTurn([1, 5, 9], [0.0] * 3, [1.0, 0.01, 1.0], "stop_token"),
                        OracleTurn([3, 4, 9], [0.0] * 3, [1.0, 0.0, 1.0], "stop_token"))
    t = free_running_tally(case, "p", [7, 7], [1, 2, 3, 4, 9], sp, 0.1, run)
    assert calls == [([7, 7], 6), ([7, 7, 1, 2], 4)]                  # re-anchored after the engine's token 2
    assert (t.total, t.decisive, t.excused, t.compared) == (5, 3, 1, 4)
    run, _ = oracle(OracleTurn([1, 5, 9], [0.0] * 3, [1.0, 0.5, 1.0], "stop_token"))
    with pytest.raises(Caught, match="step 1: engine 2 vs free-running oracle 5"):
        free_running_tally(case, "p", [7], [1, 2, 9], sp, 0.1, run)      # a decisive divergence
    run, _ = oracle(OracleTurn([1, 2, 9], [0.0] * 3, [1.0, 1.0, 1.0], "stop_token"))
    with pytest.raises(Caught, match="different lengths"):
        free_running_tally(case, "p", [7], [1, 2], sp, 0.1, run)         # the engine ends early
    run, _ = oracle(OracleTurn([1, 2, 3], [0.0] * 3, [1.0, 0.0, 0.0], "max_tokens"))
    t = free_running_tally(case, "p", [7], [1, 2, 3], sp, 0.1, run)
    assert (t.total, t.decisive, t.excused) == (3, 1, 0)                 # equal tokens at non-decisive steps count


# ---------------------------------------------------------------------------------- shapes and scales


def test_gpu_only_shape_weights_follow_the_reference_rule():
    """draw_weights is reference.weights.random_tensor's rule: on the CPU it gives random_weights' bf16 values."""
    cfg = cases.model_config("gqa2-d32")
    got = cases.draw_weights(cfg, 3, "cpu")
    want = random_weights(cfg, 3, dtype=torch.bfloat16)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_gpu_only_shape_is_a_gpu_scale_subset():
    """qwen3-8b: at the gpu scale exactly its GPU_SHAPES tests are collected, -k qwen3-0.6b leaves it out, and the
    ci scale never collects it."""
    for name, shape in cases.GPU_SHAPES.items():
        assert name in cases.SCALES["gpu"].models and name not in cases.SCALES["ci"].models
        for test in shape.tests:
            module, func = test.split("::")
            assert any(c.module == module and func in [n for n, _ in clauses.tests_of(c)]
                       for c in clauses.CLAUSES.values()), f"{name}: no test {test}"
    res = _pytest("--collect-only", "-q", "--conformance-scale", "gpu", "-k", "qwen3-8b")
    assert res.returncode == 0, res.stdout + res.stderr
    ids = {line for line in res.stdout.splitlines() if "::" in line}
    assert ids == {f"conformance/{t.replace('::', '.py::')}[qwen3-8b]" for t in cases.GPU_SHAPES["qwen3-8b"].tests}, ids
    res = _pytest("--collect-only", "-q", "--conformance-scale", "gpu", "-k", "qwen3-0.6b")
    assert res.returncode == 0 and "8b" not in res.stdout and "[qwen3-0.6b-untied]" in res.stdout, res.stdout
    res = _pytest("--collect-only", "-q", "-k", "qwen3-8b")                # ci scale: nothing
    assert res.returncode == 5 and "8b" not in res.stdout, res.stdout + res.stderr


def test_workload_prompts_fit_the_cap():
    """greedy_workload's max_prompt: at the gpu scale (prompts up to 96) every prompt, boundary lengths included, is
    within the cap; a cap at or above the scale's longest prompt gives the same workload as none (so the ci scale's MEM
    tests are unchanged by it)."""
    cfg = cases.model_config("gqa2-d32")
    gpu, ci = cases.SCALES["gpu"], cases.SCALES["ci"]
    for bs, cap in ((4, 24), (5, 27), (8, 45), (16, 24)):   # (16, 24): 2 * bs + 1 > cap
        wl = cases.greedy_workload(cfg, bs, gpu, seed=42, n_seqs=12, prompt_kind="mixed", max_prompt=cap)
        lens = [len(p.prompt) for p in wl.plans]
        assert max(lens) <= cap < gpu.max_prompt, (bs, cap, lens)
        boundary = cases.greedy_workload(cfg, bs, gpu, seed=7, n_seqs=12, prompt_kind="boundary", max_prompt=cap)
        assert max(len(p.prompt) for p in boundary.plans) <= cap
        longest = max(ci.max_prompt, 2 * bs + 1)             # the ci scale's longest prompt, boundary lengths too
        assert cases.greedy_workload(cfg, bs, ci, seed=42, n_seqs=5, max_prompt=longest) == \
            cases.greedy_workload(cfg, bs, ci, seed=42, n_seqs=5)


def test_gpu_only_shape_skips_with_its_reason():
    """Where the shape cannot run (here: no CUDA GPU, or the default --oracle-device cpu), every test of it is a skip
    that names the shape and the reason, never a pass."""
    res = _pytest("--conformance-scale", "gpu", "-k", "qwen3-8b", "-rs")
    out = res.stdout + res.stderr
    n = len(cases.GPU_SHAPES["qwen3-8b"].tests)
    assert res.returncode == 0 and f"{n} skipped" in out and "passed" not in out, out[-3000:]
    assert len(re.findall(r"shape qwen3-8b: (needs a CUDA GPU|needs --oracle-device cuda).*\(a skip, not a pass\)",
                          out)) >= 2, out[-3000:]


# ---------------------------------------------------------------------------------- clauses and markers


def test_clause_table_and_contract_doc():
    assert list(clauses.CLAUSES) == ["TURN", "ORACLE", "LOGIT", "SPLITK", "PAGED", "STATE", "MEM", "SAMPLE", "INVARIANT"]
    assert clauses.CLAUSES["INVARIANT"].module == "test_invariant" and clauses.CLAUSES["INVARIANT"].status == "active"
    for c in clauses.CLAUSES.values():
        if c.module:
            assert (ROOT / "conformance" / f"{c.module}.py").is_file()
            assert clauses.tests_of(c), f"{c.id} has no tests"
    text = clauses.render_markdown()
    assert (ROOT / "docs" / "contract.md").read_text() == text, "docs/contract.md is stale: python -m conformance.clauses"


def _item(nodeid: str, *clause_args):
    marks = [SimpleNamespace(args=(a,)) for a in clause_args]
    return SimpleNamespace(nodeid=nodeid, iter_markers=lambda name: iter(marks) if name == "clause" else iter(()),
                           get_closest_marker=lambda name: None)


def test_clause_marker_rule():
    assert clause_errors([_item("conformance/test_turn.py::t", "TURN")]) == []
    assert clause_errors([_item("conformance/meta/test_meta.py::t")]) == []
    assert "exactly one" in clause_errors([_item("conformance/test_x.py::t")])[0]
    assert "exactly one" in clause_errors([_item("conformance/test_x.py::t", "TURN", "MEM")])[0]
    assert "unknown clause" in clause_errors([_item("conformance/test_x.py::t", "NOPE")])[0]
    assert "meta-test" in clause_errors([_item("conformance/meta/test_meta.py::t", "TURN")])[0]


def test_every_collected_test_carries_one_clause():
    """The real suite collects (the collection hook rejects any test without exactly one clause), and -m selects."""
    res = _pytest("--collect-only", "-q", "-m", "TURN")
    assert res.returncode == 0, res.stdout + res.stderr
    ids = [line for line in res.stdout.splitlines() if "::" in line]
    assert ids and all(line.startswith("conformance/test_turn.py::") for line in ids), ids


# ---------------------------------------------------------------------------------- the engine loader


def test_engine_loader(monkeypatch):
    name, factory = engines.resolve("reference")
    assert name == "reference" and factory is engines.reference
    name, factory = engines.resolve("conformance.meta.broken:leaks_block")
    assert factory is broken.leaks_block
    from conformance import cases
    cfg = cases.model_config("gqa2-d32")
    eng = engines.build(factory, name, cfg, cases.make_weights(cfg), block_size=4)
    assert isinstance(eng, broken.LeaksBlock)
    monkeypatch.setenv(engines.ENV_VAR, "conformance.meta.broken:reprefills")
    assert engines.resolve(None)[1] is broken.reprefills
    monkeypatch.delenv(engines.ENV_VAR)
    assert engines.resolve(None)[0] == "reference"
    for spec, words in (("no_such_pkg.mod:f", "cannot import module"), ("conformance.engines:nope", "no attribute"),
                        ("justaname", "pkg.module:factory"), ("conformance.cases:SCALES", "not callable")):
        with pytest.raises(engines.EngineLoadError, match=words):
            engines.resolve(spec)
    with pytest.raises(engines.EngineLoadError, match="lacks"):
        engines.build(lambda *a, **k: object(), "x:y", cfg, {})


def _optimized_buildable() -> bool:
    try:
        from conformance import cases
        cfg = cases.model_config("gqa2-d32")
        engines.build(engines.optimized, "optimized", cfg, cases.make_weights(cfg), block_size=4)
        return True
    except engines.EngineLoadError:
        return False


def test_optimized_unbuildable_is_a_clear_usage_error():
    if _optimized_buildable():
        pytest.skip("the optimized engine builds here")
    res = _pytest("--engine", "optimized", "--collect-only", "-q")
    out = res.stdout + res.stderr
    assert res.returncode == 4, out                       # pytest's usage error, not 300 failing tests
    assert "turnkv conformance: --engine optimized" in out, out


def test_env_var_selects_the_engine_and_header_reports_it():
    res = _pytest("--collect-only", "-m", "LOGIT", env_extra={engines.ENV_VAR: "reference-bf16"})
    assert res.returncode == 0, res.stdout + res.stderr
    head = res.stdout
    assert "engine 'reference-bf16'" in head and "dtype bfloat16" in head and "CuPy" in head and "torch" in head, head


# ---------------------------------------------------------------------------------- the failure template


def test_failure_message_names_clause_and_repro():
    rep = Repro(["from conformance.repro import *", "x = 1"])
    rep.mark_setup()
    for i in range(60):
        rep.add(f"eng.rollout_continue({i}, [])")
    msg = failure_message("MEM", "something leaked", rep)
    assert msg.startswith(f"{FAILURE_TAG} [MEM]") and "something leaked" in msg
    assert "x = 1" in msg and "eng.rollout_continue(59, [])" in msg and "earlier calls" in msg
    path = re.search(r"full script: (\S+)\):", msg).group(1)
    assert "eng.rollout_continue(0, [])" in Path(path).read_text()


# ---------------------------------------------------------------------------------- broken engines


@pytest.mark.parametrize("name", sorted(broken.EXPECTED))
def test_broken_engine_is_caught_by_its_clause(name):
    clause, selection = broken.EXPECTED[name]
    res = _pytest("--engine", f"conformance.meta.broken:{name}", "-m", clause, "-k", selection, "-x", "-q")
    out = res.stdout + res.stderr
    assert res.returncode == 1, f"{name} was not caught (rc {res.returncode}):\n{out[-3000:]}"
    tags = set(re.findall(rf"{FAILURE_TAG} \[(\w+)\]", out))
    assert tags == {clause}, f"{name}: failures name {tags}, expected {{{clause!r}}}:\n{out[-3000:]}"
    script = re.search(r"full script: (\S+)\):", out)
    assert script, out[-2000:]
    run = subprocess.run([sys.executable, script.group(1)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, f"the repro script does not run:\n{run.stdout}\n{run.stderr}"


def test_declined_shapes_are_skipped_with_their_reason():
    """An engine that declines a model shape gets skips that name the shape and the reason, never passes."""
    r = _pytest("-m", "LOGIT", "-rs", "--engine", "conformance.meta.broken:declines_d16")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert re.search(r"declines shape mha-d16: head_dim 16 \(a skip, not a pass\)", out), out[-3000:]
    assert "passed" in out and "skipped" in out
