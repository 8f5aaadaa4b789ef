"""Fixtures and the report hook of the benches.

``--bench-scale gpu`` runs the real sweeps on a CUDA GPU (the optimized engine, our kernels, torch
SDPA and transformers as peers); ``--bench-scale cpu`` runs the same benches at tiny sizes with
the reference engine and kernels on the CPU (a smoke test of the harness, well under a minute).
The default, ``auto``, is ``gpu`` when torch sees a CUDA device and ``cpu`` otherwise.

At the end of the session every bench group is written to ``--bench-out`` (default
``benches/results`` on the GPU scale, a temporary folder on the CPU scale) as ``<group>.json``
(every number, the command line, the environment), ``<group>.md`` (tables) and ``<group>.png``,
with ``summary.json`` (all targets), ``latest.md`` (every table, included by the docs) and ``floors.md`` /
``.json`` / ``.png`` (each kernel's floor and achieved, ``benches/floors.py``) when a kernel lab, the engine decode
bench or the agentic bench ran.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from _bench import (PEER_SDPA, REPO, Collector, Scale, free_cuda, gpu_unavailable_reason, scale_name,  # noqa: E402
                    peer_sdpa, write_reports)


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("turnkv benches")
    g.addoption("--bench-scale", choices=("auto", "cpu", "gpu"), default="auto",
                help="gpu: the real sweeps on a CUDA GPU; cpu: tiny sizes with the reference engine "
                     "(smoke test); auto (default): gpu if torch sees a CUDA device, else cpu")
    g.addoption("--bench-out", default=None,
                help="where the JSON / markdown / PNG reports go (default: benches/results on the gpu scale, "
                     "a temporary folder on the cpu scale)")
    g.addoption("--hf-sdpa", default=PEER_SDPA,
                help="the SDPA backends transformers' peer may pick, comma-separated torch SDPBackend names, or "
                     f"'torch' for torch's own choice (default: {PEER_SDPA}: every backend but cuDNN's, whose "
                     "per-shape plans cost a generate loop a plan at every decode step)")


def _scale(config: pytest.Config) -> Scale:
    """The session's scale: ``--bench-scale`` resolved, with ``--hf-sdpa`` (unknown backends raise ``ValueError``)."""
    return Scale(scale_name(config), peer_sdpa=peer_sdpa(config.getoption("--hf-sdpa")))


def _out_dir(config: pytest.Config) -> Path:
    out = config.getoption("--bench-out")
    if out:
        return Path(out)
    if scale_name(config) == "gpu":
        return REPO / "benches" / "results"
    return Path(tempfile.gettempdir()) / "turnkv-bench-cpu"


def pytest_configure(config: pytest.Config) -> None:
    try:
        config._turnkv_scale = _scale(config)       # the session's one Scale, for the fixture and the report hook
    except ValueError as e:
        raise pytest.UsageError(f"--hf-sdpa: {e}") from None
    config._turnkv_results = Collector()


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"turnkv benches: scale {scale_name(config)}, reports -> {_out_dir(config)}, transformers' SDPA backends: "
            f"{config.getoption('--hf-sdpa')}"]


@pytest.fixture(scope="session")
def scale(pytestconfig: pytest.Config) -> Scale:
    s = pytestconfig._turnkv_scale
    if s.gpu:
        reason = gpu_unavailable_reason()
        if reason:
            pytest.skip(reason)
        torch.backends.cuda.matmul.allow_tf32 = False
    else:
        torch.manual_seed(0)
        torch.set_num_threads(1)      # tiny problems: threads only add synchronisation (and noise on shared CI machines)
    return s


@pytest.fixture(scope="session")
def results(pytestconfig: pytest.Config) -> Collector:
    return pytestconfig._turnkv_results


@pytest.fixture(scope="session")
def ceilings(scale: Scale, results: Collector) -> dict:
    """Device-to-device copy bandwidth and bf16 GEMM rate, measured once per session (used by every
    bench as the physical limits its numbers are divided by)."""
    from _ceilings import measure_ceilings
    c = measure_ceilings(scale)
    free_cuda()
    return c


@pytest.fixture(scope="module", autouse=True)
def _free_after_module():
    """Collect the engines, models and buffers of a bench file once its module fixtures are gone."""
    yield
    free_cuda()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    col: Collector | None = getattr(session.config, "_turnkv_results", None)
    if col is None or not any(g.records or g.targets for g in col.groups.values()):
        return
    session.config._turnkv_written = write_reports(col, _out_dir(session.config),
                                                   getattr(session.config, "_turnkv_scale", None))


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    col: Collector | None = getattr(config, "_turnkv_results", None)
    written = getattr(config, "_turnkv_written", None)
    if not col or not written:
        return
    tr = terminalreporter
    tr.section("turnkv bench targets (reported, not asserted)")
    for name, g in col.groups.items():
        for t in g.targets:
            met = {True: "MET ", False: "miss", None: "n/a "}[t["met"]]
            val = "–" if t["value"] is None else f"{t['value']:.3g}"
            tr.write_line(f"[{met}] {name}: {t['target']}: {val} (goal {t['goal']}) {t['detail']}")
    tr.write_line(f"reports: {', '.join(sorted({str(p.parent) for p in written}))} "
                  f"({len(written)} files: {', '.join(p.name for p in written)})")
