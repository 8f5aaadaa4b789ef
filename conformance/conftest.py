"""pytest wiring of the conformance suite: engine selection, scale, clause markers, report header/summary."""

from __future__ import annotations

import gc
import json
import os

import pytest
import torch

from conformance import cases, engines, oracles
from conformance.clauses import CLAUSES
from conformance.harness import Conformance

_STATE: dict = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("turnkv conformance")
    g.addoption("--engine", action="store", default=None,
                help="engine under test: reference | optimized | reference-bf16 | pkg.module:factory "
                     f"(default: ${engines.ENV_VAR}, else reference)")
    g.addoption("--conformance-scale", action="store", default="ci", choices=sorted(cases.SCALES),
                help="ci (tiny shapes, default) or gpu (adds the qwen3-0.6b shape, 64 sequences, 8 turns, and a "
                     "subset of the tests at the qwen3-8b shape: -k qwen3-8b; it needs --oracle-device cuda)")
    g.addoption("--oracle-device", action="store", default="cpu",
                help="where the fp32 model oracles run: cpu (default), cuda, or auto (cuda when available)")
    g.addoption("--engine-kwargs", action="store", default=None,
                help='extra engine kwargs for every engine the suite builds, as JSON, e.g. \'{"split_kv": "auto"}\'')


def _engine_spec(config: pytest.Config) -> str:
    return (config.getoption("--engine") or os.environ.get(engines.ENV_VAR) or engines.DEFAULT_ENGINE).strip()


def pytest_configure(config: pytest.Config) -> None:
    threads = os.environ.get("TURNKV_CONFORMANCE_THREADS")
    if threads or config.getoption("--conformance-scale") == "ci":
        # the CI shapes are tiny: one thread is fastest, and immune to oversubscribed CPUs
        torch.set_num_threads(int(threads or 1))
    config.addinivalue_line("markers", "clause(id): the contract clause a conformance test checks (exactly one)")
    config.addinivalue_line("markers", "meta: a test of the conformance harness itself (no clause)")
    config.addinivalue_line("markers", "kernel_api: a test that calls the engine's kernels directly (engine.kernels); "
                                       "-m 'not kernel_api' leaves the engine-level tests")
    for c in CLAUSES.values():
        config.addinivalue_line("markers", f"{c.id}: contract clause {c.id}: {c.title}")
    spec = _engine_spec(config)
    try:
        name, factory = engines.resolve(spec)
        kw = json.loads(config.getoption("--engine-kwargs") or "{}")
        cfg = cases.model_config("gqa2-d32")
        probe = engines.build(factory, name, cfg, cases.make_weights(cfg), **{**cases.engine_defaults("gqa2-d32"), **kw})
    except engines.EngineLoadError as e:
        raise pytest.UsageError(f"turnkv conformance: {e}") from e
    except json.JSONDecodeError as e:
        raise pytest.UsageError(f"--engine-kwargs must be JSON: {e}") from e
    _STATE["conf"] = Conformance(name, factory, cases.SCALES[config.getoption("--conformance-scale")], kw,
                                 engine_device=str(getattr(probe, "device", "?")))
    _STATE["header"] = engines.describe(name, probe)
    _STATE["header"].append(f"  scale {config.getoption('--conformance-scale')}: models "
                            f"{', '.join(_STATE['conf'].scale.models)}; engine kwargs {kw or '{}'}")
    _STATE["header"].append(f"  fp32 oracles on: {oracles.set_device(config.getoption('--oracle-device'))}")


def pytest_report_header(config: pytest.Config) -> list[str]:
    return _STATE.get("header", [])


def clause_errors(items) -> list[str]:
    """Every contract test carries exactly one known clause; meta-tests (under ``meta/``) carry none."""
    errors = []
    for item in items:
        marks = list(item.iter_markers("clause"))
        is_meta = "/meta/" in item.nodeid.replace("\\", "/") or item.get_closest_marker("meta") is not None
        if is_meta:
            if marks:
                errors.append(f"{item.nodeid}: a meta-test carries a clause marker")
            continue
        ids = [m.args[0] if m.args else None for m in marks]
        if len(ids) != 1:
            errors.append(f"{item.nodeid}: carries {len(ids)} clause markers {ids}, exactly one is required")
        elif ids[0] not in CLAUSES:
            errors.append(f"{item.nodeid}: unknown clause {ids[0]!r} (known: {', '.join(CLAUSES)})")
    return errors


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    errors = clause_errors(items)
    if errors:
        raise pytest.UsageError("conformance clause markers:\n  " + "\n  ".join(errors))
    for item in items:
        m = item.get_closest_marker("clause")
        if m is not None:
            item.add_marker(getattr(pytest.mark, m.args[0]))   # so that `-m TURN` selects a clause


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "model" in metafunc.fixturenames:
        test = f"{metafunc.module.__name__.rsplit('.', 1)[-1]}::{metafunc.function.__name__}"
        metafunc.parametrize("model", [m for m in _STATE["conf"].scale.models if cases.runs_test(m, test)])


@pytest.fixture(autouse=True)
def _release_gpu_shape_engines(request: pytest.FixtureRequest):
    """After a test at a GPU-only shape, collect its engines now (gigabytes of GPU memory each; an engine's
    graphs and runner may form reference cycles that would otherwise wait for the next gc pass) and hand
    torch's cached blocks back, for allocators other than torch's (CuPy's pool)."""
    yield
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("model") in cases.GPU_SHAPES:
        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()


@pytest.fixture(scope="session")
def conf() -> Conformance:
    return _STATE["conf"]


@pytest.fixture(scope="session")
def scale(conf: Conformance) -> cases.Scale:
    return conf.scale


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001
    conf = _STATE.get("conf")
    if conf is None or not conf.report:
        return
    terminalreporter.section("turnkv conformance report")
    for line in conf.report:
        terminalreporter.write_line(line)
