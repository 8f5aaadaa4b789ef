"""nox sessions for turnkv.

``nox`` alone runs what CI runs (no GPU needed): ``tests``, ``conformance`` on the reference
engine, ``conformance-host`` (the optimized engine's host side on stand-in kernels), ``kernels`` (nvcc compile check
for sm_90), ``docs`` and ``lint``. ``benches`` and
``conformance -- --engine optimized`` need a CUDA GPU.

Torch: ``torch==2.13.0`` is pinned for the CPU machines, where pip finds a CPU wheel locally;
uv would download a multi-GB CUDA build, so the sessions use nox's default virtualenv + pip.
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["tests", "distributed", "conformance", "conformance-host", "kernels", "benches-cpu", "docs",
                        "lint"]
nox.options.reuse_existing_virtualenvs = True

TORCH = os.environ.get("TURNKV_TORCH", "torch==2.13.0")


def _install(session: nox.Session, extras: str) -> None:
    session.install(TORCH)
    session.install("-e", f".[{extras}]")


@nox.session
def tests(session: nox.Session) -> None:
    """The reference engine's own tests (model vs transformers, rollout semantics, errors)."""
    _install(session, "test")
    session.run("pytest", "tests", "-q", "--ignore=tests/test_distributed.py", *session.posargs)


@nox.session
@nox.parametrize("engine", [os.environ.get("TURNKV_ENGINE", "reference")])
def conformance(session: nox.Session, engine: str) -> None:
    """The contract (DESIGN §4). ``nox -s conformance -- --engine optimized`` judges the optimized engine."""
    _install(session, "test")
    args = list(session.posargs)
    if not any(a.startswith("--engine") for a in args):
        args = ["--engine", engine, *args]
    session.run("pytest", "conformance", "-q", *args)


@nox.session(name="conformance-host")
@nox.parametrize("factory", ["optimized_host", "optimized_host_no_prefill_graphs"])
def conformance_host(session: nox.Session, factory: str) -> None:
    """The optimized engine's host side on the CPU (stand-in kernels and CUDA graphs, ``tests/_standin_engine.py``)
    judged by the engine-level clauses; the tests that call the engine's kernels directly are left out."""
    _install(session, "test")
    session.run("pytest", "conformance", "-q", "--engine", f"_standin_engine:{factory}", "-m", "not kernel_api",
                *session.posargs, env={"PYTHONPATH": "tests"})


@nox.session
def distributed(session: nox.Session) -> None:
    """TP x CP reference engine on torch.distributed: 4 CPU processes with gloo (NCCL cases where GPUs exist)."""
    _install(session, "test")
    session.run("pytest", "tests/test_distributed.py", "-q", *session.posargs)


@nox.session
def kernels(session: nox.Session) -> None:
    """Every optimized/kernels/*.cu compiles for sm_90 with nvcc (no GPU needed)."""
    # run as a file: importing the optimized package would need torch, the compile check needs only nvcc
    session.run("python", "optimized/kernels/build_check.py", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """Sphinx + MyST, warnings as errors."""
    _install(session, "docs")
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "reference", "optimized", "conformance", "tests", "benches", "noxfile.py")


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: a multi-turn rollout on the embedded tiny model."""
    _install(session, "test")
    session.run("turnkv-rollout", *session.posargs)


@nox.session
def benches(session: nox.Session) -> None:
    """GPU benchmarks (pytest-benchmark); results land under benches/results/.

    On a GPU machine set ``TURNKV_TORCH`` to the torch you want (or run ``bash benches/run_gpu.sh``
    with the machine's own Python)."""
    _install(session, "bench")
    session.run("pytest", "benches", "-q", "--bench-scale", "gpu", *session.posargs)


@nox.session(name="benches-cpu")
def benches_cpu(session: nox.Session) -> None:
    """The bench harness at CPU scale (tiny model, reference engine): checks, JSON, table and plot."""
    _install(session, "bench")
    session.run("pytest", "benches", "-q", "--bench-scale", "cpu", "--bench-out",
                f"{session.create_tmp()}/bench", *session.posargs)
