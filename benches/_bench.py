"""Shared machinery of the benches: timing, the correctness rule, the results collector and its
writers (JSON, markdown, PNG), model weights, the transformers peer and the roofline.

Two scales (``--bench-scale``):

* ``gpu``: the optimized engine and our CUDA kernels (``optimized.ops``) on a CUDA GPU, timed with
  CUDA events after warm-up, beside torch SDPA and transformers on the same GPU;
* ``cpu``: the reference engine and the reference kernels on the CPU at tiny sizes, timed with
  ``time.perf_counter``: a smoke test of the harness that any machine can run.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NoReturn

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from reference.config import ModelConfig  # noqa: E402
from reference.weights import expected_shapes, random_tensor  # noqa: E402

#: one bf16 rounding step, relative (8 significant bits)
BF16_EPS = 2.0 ** -8
#: L2 of an H200 is 50 MB (60 MB is used as the bound): inputs are rotated until the sets together span this much
ROTATE_BYTES = 256 << 20
#: a GPU spin before each timed region, so that the host can enqueue the region while the GPU is busy
#: (launch overhead stays out of the CUDA-event time); about 1 ms at H200 clocks. 0.2 ms was too short:
#: an eager op with its Python argument checks and CuPy launch can take longer than that to enqueue,
#: and the event time then measured the host (the enqueue time is recorded as ``host_ms``).
SPIN_CYCLES = 2_000_000


# =====================================================================================================
# scale
# =====================================================================================================

#: the SDPA backends transformers' peer may pick (``--hf-sdpa``): every backend but cuDNN's. On torch 2.11 SDPA
#: picks cuDNN's on Hopper, which builds a plan for each new shape, and a ``generate`` loop meets a new key length at
#: every decode step: the fifty-second session's runs of ``benches/gpu/profile_agentic_peer.py`` measured it (the
#: agentic peer's turn 1: 9.64 s on its first run, 4.36 s repeated with the same shapes, 4.24 s without cuDNN's).
PEER_SDPA = "flash_attention,efficient_attention,math"


@dataclass(frozen=True)
class Scale:
    name: str                       # "cpu" | "gpu"
    peer_sdpa: str | None = PEER_SDPA   # SDPA backends of transformers' peer (``sdpa_backends``); None: torch's choice

    @property
    def gpu(self) -> bool:
        return self.name == "gpu"

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if self.gpu else torch.device("cpu")

    def pick(self, cpu: Any, gpu: Any) -> Any:
        """The problem-size table entry of this scale."""
        return gpu if self.gpu else cpu

    def sync(self) -> None:
        if self.gpu:
            torch.cuda.synchronize()


def scale_name(config) -> str:
    """``--bench-scale`` resolved: ``auto`` is ``gpu`` when torch sees a CUDA device, else ``cpu``."""
    name = config.getoption("--bench-scale")
    if name == "auto":
        name = "gpu" if torch.cuda.is_available() else "cpu"
    return name


def gpu_unavailable_reason() -> str | None:
    """Why the GPU scale cannot run here (None when it can)."""
    if not torch.cuda.is_available():
        return "--bench-scale gpu needs a CUDA GPU and torch sees none"
    try:
        import cupy  # noqa: F401
    except Exception as e:  # noqa: BLE001  (ImportError, or a CUDA library load error)
        return f"--bench-scale gpu needs CuPy ({type(e).__name__}: {e})"
    return None


# =====================================================================================================
# timing
# =====================================================================================================

@dataclass
class Timing:
    median_ms: float
    p10_ms: float
    p90_ms: float
    min_ms: float
    reps: int
    sets: int = 1
    host_ms: float | None = None   # median host time to enqueue one round (GPU: spin excluded)

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        d = {f"{prefix}median_ms": self.median_ms, f"{prefix}p10_ms": self.p10_ms,
             f"{prefix}p90_ms": self.p90_ms, f"{prefix}reps": self.reps}
        if self.host_ms is not None:
            d[f"{prefix}host_ms"] = self.host_ms
        return d


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def rotation_sets(bytes_per_set: int, cap: int = 32) -> int:
    """How many input sets to rotate through so that repeated runs do not measure the L2."""
    return max(1, min(cap, math.ceil(ROTATE_BYTES / max(1, bytes_per_set))))


def time_fn(benchmark, fn: Callable[[int], Any], scale: Scale, *, sets: int = 1, budget_s: float | None = None,
            min_rounds: int | None = None, max_rounds: int = 200, warmup: int = 3) -> Timing:
    """Time ``fn(i)`` (``i`` = the rotation index ``rep % sets``) after warm-up and return the medians.

    GPU: each round spins the GPU (``torch.cuda._sleep``), records a CUDA event, runs ``fn``,
    records a second event and synchronizes; the reported numbers are the event times. The
    rounds go through ``benchmark.pedantic`` so that pytest-benchmark's own statistics (host
    wall time per round, spin included) describe the same runs. CPU: ``time.perf_counter``.
    The number of rounds is chosen from one probe run so that a case costs about ``budget_s``.
    """
    gpu = scale.gpu
    budget_s = budget_s if budget_s is not None else (0.4 if gpu else 0.03)
    min_rounds = min_rounds if min_rounds is not None else (10 if gpu else 3)
    times: list[float] = []
    host: list[float] = []
    counter = [0]
    spin = getattr(torch.cuda, "_sleep", None) if gpu else None
    if gpu:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def run() -> None:
        i = counter[0] % sets
        counter[0] += 1
        if gpu:
            if spin is not None:
                spin(SPIN_CYCLES)
            t0 = time.perf_counter()
            start.record()
            fn(i)
            end.record()
            host.append((time.perf_counter() - t0) * 1e3)
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn(i)
            times.append((time.perf_counter() - t0) * 1e3)

    for _ in range(warmup):          # module load, compilation, autotuning, allocator
        run()
    probe = statistics.median(times[-max(1, min(3, warmup)):]) if times else 1.0
    rounds = int(max(min_rounds, min(max_rounds, budget_s * 1e3 / max(probe, 1e-3))))
    times.clear()
    host.clear()
    benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=1)
    times = times[1:] if len(times) > rounds else times
    return Timing(statistics.median(times), _quantile(times, 0.1), _quantile(times, 0.9), min(times), len(times), sets,
                  statistics.median(host) if host else None)


class GcClock:
    """Time spent in Python's garbage collector while installed (``gc.callbacks``): seconds and collections per
    generation. A host-bound region (eager launches) slows down when collections over a large heap fall in it."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._t: float | None = None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        elif self._t is not None:
            g = info["generation"]
            self.seconds[g] += time.perf_counter() - self._t
            self.collections[g] += 1
            self._t = None

    def __enter__(self) -> "GcClock":
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self)


class Stopwatch:
    """Wall time of a region that ends with a host synchronisation (CUDA events alongside on the GPU), with the
    process's CPU time over it (every thread) and the garbage collector's share (``GcClock``): a wall time that grows
    with the CPU time is host work, one that grows without it is waiting."""

    def __init__(self, scale: Scale) -> None:
        self.scale = scale
        self.wall_s = self.cpu_s = 0.0
        self.event_s: float | None = None
        self.gc = GcClock()

    def __enter__(self) -> "Stopwatch":
        self.scale.sync()
        if self.scale.gpu:
            self._e0, self._e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._e0.record()
        self.gc.__enter__()
        self.c0 = time.process_time()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.scale.gpu:
            self._e1.record()
        self.scale.sync()
        self.wall_s = time.perf_counter() - self.t0
        self.cpu_s = time.process_time() - self.c0
        self.gc.__exit__()
        if self.scale.gpu:
            self.event_s = self._e0.elapsed_time(self._e1) / 1e3

    @property
    def gc_s(self) -> float:
        return sum(self.gc.seconds)


# =====================================================================================================
# correctness: the flash-attention rule
# =====================================================================================================

def flash_rule(out: torch.Tensor, ref: torch.Tensor, ref_lowp: torch.Tensor, what: str) -> dict[str, float]:
    """``out`` against the high-precision ``ref``, allowed twice the error of the low-precision
    reference run ``ref_lowp`` plus one bf16 rounding step of the reference's magnitude (max and mean).

    Raises ``AssertionError`` with the numbers when it fails; returns them for the record.
    """
    out, ref, low = out.double(), ref.double(), ref_lowp.double()
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    bad = int((~torch.isfinite(out)).sum())
    assert bad == 0, f"{what}: {bad} non-finite values in the output"
    err = (out - ref).abs()
    base = (low - ref).abs()
    mag_max, mag_mean = float(ref.abs().max()), float(ref.abs().mean())
    e_max, e_mean = float(err.max()), float(err.mean())
    b_max, b_mean = float(base.max()), float(base.mean())
    tol_max = 2 * b_max + BF16_EPS * mag_max
    tol_mean = 2 * b_mean + BF16_EPS * mag_mean
    rel = float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30))
    rec = {"err_max": e_max, "err_mean": e_mean, "ref_lowp_err_max": b_max, "rel_err": rel}
    assert e_max <= tol_max and e_mean <= tol_mean, (
        f"{what}: flash-attention rule fails: max err {e_max:.3e} (allowed {tol_max:.3e} = 2 x {b_max:.3e} + 1 ulp), "
        f"mean err {e_mean:.3e} (allowed {tol_mean:.3e}); relative {rel:.3e}")
    return rec


# =====================================================================================================
# results
# =====================================================================================================

@dataclass
class GroupReport:
    title: str = ""
    columns: list[tuple[str, str, str]] | None = None     # (key, header, format spec)
    plots: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)
    targets: list[dict] = field(default_factory=list)


class Collector:
    """Where the benches put their numbers; written out at the end of the session."""

    def __init__(self) -> None:
        self.groups: dict[str, GroupReport] = {}
        self.started = time.time()

    def group(self, name: str) -> GroupReport:
        return self.groups.setdefault(name, GroupReport(title=name))

    def describe(self, name: str, title: str, columns=None, plots=None) -> None:
        g = self.group(name)
        g.title = title
        g.columns = columns
        g.plots = list(plots or [])

    def add(self, name: str, **record: Any) -> dict:
        rec = {k: _plain(v) for k, v in record.items()}
        self.group(name).records.append(rec)
        return rec

    def note(self, name: str, text: str) -> None:
        if text not in self.group(name).notes:
            self.group(name).notes.append(text)

    def target(self, name: str, what: str, value: float | None, goal: float, op: str = ">=", unit: str = "",
               detail: str = "") -> dict:
        """A target of DESIGN §5 / issue 5, reported (never asserted)."""
        met = None if value is None or not math.isfinite(value) else (value >= goal if op == ">=" else value <= goal)
        t = {"target": what, "value": value, "goal": f"{op} {goal:g}{unit}", "met": met, "detail": detail}
        self.group(name).targets.append(t)
        return t


def _plain(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _fmt(v: Any, spec: str = "") -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if spec:
            return format(v, spec)
        return f"{v:.4g}"
    return str(v)


def command_line() -> str:
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    return " ".join(shlex.quote(a) for a in argv)


def _version(mod: str) -> str | None:
    try:
        m = __import__(mod)
        return getattr(m, "__version__", "?")
    except Exception:  # noqa: BLE001
        return None


def host_cpu() -> str:
    """The host's CPU model (``/proc/cpuinfo``'s first ``model name``, else ``platform.processor()``): peers that launch
    from Python, as transformers' ``generate``, run as fast as this CPU lets them, so a report names it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def environment(scale: Scale | None) -> dict[str, Any]:
    env: dict[str, Any] = {
        "timestamp_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "scale": scale.name if scale else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cupy": _version("cupy"),
        "transformers": _version("transformers"),
        "pytest_benchmark": _version("pytest_benchmark"),
        "host_cpu": host_cpu(),
        "peer_sdpa": (scale.peer_sdpa or "torch's choice") if scale else None,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    try:
        env["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                           timeout=10).stdout.strip() or None
        env["git_dirty"] = bool(subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True,
                                               text=True, timeout=10).stdout.strip())
    except Exception:  # noqa: BLE001
        env["git_commit"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        env |= {"device": p.name, "capability": f"{p.major}.{p.minor}", "sm_count": p.multi_processor_count,
                "device_memory_gib": round(p.total_memory / 2**30, 1), "cudnn": torch.backends.cudnn.version()}
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=20).stdout.strip() or None
        except Exception:  # noqa: BLE001
            env["driver"] = None
    else:
        env["device"] = platform.processor() or platform.machine()
    return env


def _table(records: list[dict], columns) -> list[str]:
    if not records:
        return ["(no records)"]
    if columns is None:
        keys: list[str] = []
        for r in records:
            keys += [k for k in r if k not in keys]
        columns = [(k, k, "") for k in keys]
    cols = [c for c in columns if any(c[0] in r for r in records)]
    lines = ["| " + " | ".join(h for _, h, _ in cols) + " |", "|" + "|".join(" --- " for _ in cols) + "|"]
    for r in records:
        lines.append("| " + " | ".join(_fmt(r.get(k), f) for k, _, f in cols) + " |")
    return lines


def _targets_table(targets: list[dict]) -> list[str]:
    lines = ["| target | value | goal | met | detail |", "| --- | --- | --- | --- | --- |"]
    for t in targets:
        met = {True: "**yes**", False: "no", None: "–"}[t["met"]]
        lines.append(f"| {t['target']} | {_fmt(t['value'], '.3g')} | {t['goal']} | {met} | {t['detail']} |")
    return lines


def group_markdown(name: str, g: GroupReport, env: dict, cmd: str, level: int = 1, image: bool = True) -> str:
    h = "#" * level
    out = [f"{h} {g.title}", "",
           f"Measured {env.get('timestamp_utc')} on {env.get('device')}, host CPU {env.get('host_cpu')} "
           f"(scale `{env.get('scale')}`; torch {env.get('torch')}, CuPy {env.get('cupy')}, transformers "
           f"{env.get('transformers')}, its SDPA backends: {env.get('peer_sdpa')}; commit "
           f"{(env.get('git_commit') or '?')[:12]}{' + local changes' if env.get('git_dirty') else ''}).", "",
           f"Command: `{cmd}`", ""]
    if g.targets:
        out += [f"{h}# Targets", "", *_targets_table(g.targets), ""]
    out += [f"{h}# Results", "", *_table(g.records, g.columns), ""]
    if g.notes:
        out += [f"{h}# Notes", ""] + [f"- {n}" for n in g.notes] + [""]
    if image and g.plots and g.records:
        out += [f"![{g.title}]({name}.png)", ""]
    return "\n".join(out)


def _plot(name: str, g: GroupReport, path: Path) -> bool:
    if not g.plots or not g.records:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []   # (plot spec, facet value, records)
    for spec in g.plots:
        recs = [r for r in g.records if r.get(spec["y"]) is not None and r.get(spec["x"]) is not None
                and all(r.get(k) == v for k, v in spec.get("where", {}).items())]
        if not recs:
            continue
        facet = spec.get("facet")
        values = list(dict.fromkeys(r.get(facet) for r in recs)) if facet else [None]
        for v in values:
            panels.append((spec, v, [r for r in recs if facet is None or r.get(facet) == v]))
    if not panels:
        return False
    n = len(panels)
    ncols = min(3, n)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.8 * nrows), squeeze=False)
    for ax, (spec, v, recs) in zip(axes.flat, panels):
        series = spec.get("series")
        names = list(dict.fromkeys(r.get(series) for r in recs)) if series else [None]
        xs_all = list(dict.fromkeys(r[spec["x"]] for r in recs))
        categorical = any(isinstance(x, str) for x in xs_all)
        for s in names:
            pts = [(r[spec["x"]], r[spec["y"]]) for r in recs if series is None or r.get(series) == s]
            if categorical:
                pts = [(xs_all.index(x), y) for x, y in pts]
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=str(s) if s is not None else None)
        if categorical:
            ax.set_xticks(range(len(xs_all)))
            ax.set_xticklabels([str(x) for x in xs_all], rotation=30, ha="right", fontsize=8)
        if not spec.get("logx") and not categorical and len(xs_all) <= 16 and all(isinstance(x, int) for x in xs_all):
            ax.set_xticks(sorted(xs_all))
        if spec.get("logx") and not categorical:
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(xs_all))
            ax.set_xticklabels([str(x) for x in sorted(xs_all)], fontsize=8)
            ax.minorticks_off()
        if spec.get("logy"):
            ax.set_yscale("log")
        for hl in spec.get("hlines", []):
            ax.axhline(hl[0], ls="--", lw=1, color="grey")
            ax.annotate(hl[1], (0.01, hl[0]), xycoords=("axes fraction", "data"), fontsize=7, color="grey",
                        va="bottom")
        title = spec.get("title", "")
        if v is not None:
            title = f"{title} ({spec['facet']} = {v})" if title else f"{spec['facet']} = {v}"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(spec.get("xlabel", spec["x"]))
        ax.set_ylabel(spec.get("ylabel", spec["y"]))
        ax.grid(True, alpha=0.3)
        if series:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(g.title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_reports(collector: Collector, out_dir: Path, scale: Scale | None) -> list[Path]:
    """``<group>.json``, ``<group>.md``, ``<group>.png`` per group, plus ``summary.json`` and ``latest.md``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    env = environment(scale)
    cmd = command_line()
    written: list[Path] = []
    latest = ["<!-- written by benches/conftest.py; included by docs/benchmarks.md -->", ""]
    summary: dict[str, Any] = {"command": cmd, "env": env, "elapsed_s": round(time.time() - collector.started, 1),
                               "targets": {}}
    for name, g in collector.groups.items():
        if not g.records and not g.targets:
            continue
        data = {"group": name, "title": g.title, "command": cmd, "env": env, "records": g.records,
                "targets": g.targets, "notes": g.notes}
        p = out_dir / f"{name}.json"
        p.write_text(json.dumps(data, indent=1, default=str))
        written.append(p)
        png = out_dir / f"{name}.png"
        has_png = _plot(name, g, png)
        if has_png:
            written.append(png)
        md = out_dir / f"{name}.md"
        md.write_text(group_markdown(name, g, env, cmd, level=1, image=has_png))
        written.append(md)
        latest.append(group_markdown(name, g, env, cmd, level=3, image=False))
        summary["targets"][name] = g.targets
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    (out_dir / "latest.md").write_text("\n".join(latest))
    written += [out_dir / "summary.json", out_dir / "latest.md"]
    from floors import GROUPS as FLOOR_GROUPS, write_floors   # benches/floors.py, beside this file
    floor_groups = {n: g.records for n, g in collector.groups.items() if n in FLOOR_GROUPS and g.records}
    if floor_groups:   # floor and achieved, kernel by kernel (docs/performance.md)
        try:
            written += write_floors(floor_groups, out_dir, {n: cmd for n in floor_groups},
                                    source=f"the run of {env['timestamp_utc']} on {env.get('device')} "
                                           f"(scale {env['scale']}; transformers' SDPA backends: {env.get('peer_sdpa')})")
        except Exception as e:  # noqa: BLE001 -- the groups' own reports are written; say why this one is not
            msg = f"benches/floors.py could not build the table: {type(e).__name__}: {e}"
            (out_dir / "floors.md").write_text(f"# Floor and achieved, kernel by kernel\n\n{msg}\n")
            written.append(out_dir / "floors.md")
            print(f"turnkv benches: {msg}", file=sys.stderr)
    return written


# =====================================================================================================
# models: weights, engines, the transformers peer, the roofline
# =====================================================================================================

_WEIGHTS: dict[tuple, dict[str, torch.Tensor]] = {}


def model_weights(cfg: ModelConfig, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    """The reference's seeded random weights (``reference.weights.random_tensor``), on the CPU in
    ``dtype``, drawn one tensor per thread (each tensor has its own generator, so the values are
    those of a serial draw). Cached per (model, dtype, seed) until ``drop_weights``."""
    key = (cfg.name, dtype, seed)
    if key not in _WEIGHTS:
        shapes = expected_shapes(cfg)
        with ThreadPoolExecutor(max_workers=max(1, min(16, os.cpu_count() or 1))) as ex:
            tensors = ex.map(lambda kv: (kv[0], random_tensor(kv[0], kv[1], seed).to(dtype)), shapes.items())
            _WEIGHTS[key] = dict(tensors)
    return _WEIGHTS[key]


def drop_weights(name: str | None = None) -> None:
    """Forget the cached weights of model ``name`` (all models when None)."""
    for key in [k for k in _WEIGHTS if name is None or k[0] == name]:
        del _WEIGHTS[key]
    gc.collect()


def decode_pool(tokens_per_seq: int, max_seqs: int, block_size: int) -> dict[str, int]:
    """Engine sizes for ``max_seqs`` sequences of up to ``tokens_per_seq`` tokens each: ``max_num_seqs``,
    ``max_model_len`` (whole blocks) and ``num_blocks`` (every sequence's blocks + 8 spare)."""
    per_seq = -(-tokens_per_seq // block_size)
    return dict(max_num_seqs=max_seqs, max_model_len=per_seq * block_size, num_blocks=max_seqs * per_seq + 8)


def make_engine(scale: Scale, cfg: ModelConfig, weights: dict[str, torch.Tensor], **engine_kwargs: Any):
    """The optimized engine on the GPU scale, the reference engine (fp32) on the CPU scale."""
    if scale.gpu:
        import optimized
        return optimized.Engine.from_state_dict(cfg, weights, device=str(scale.device), **engine_kwargs)
    import reference
    return reference.Engine.from_state_dict(cfg, weights, **engine_kwargs)


def alloc_retries(scale: Scale) -> int | None:
    """How often, so far in this process, a ``cudaMalloc`` of torch's caching allocator failed and the allocator freed
    its cached blocks and tried again (``num_alloc_retries``; each is a device synchronisation and a round of frees):
    a peer whose time moves from run to run near the card's memory limit shows it here. ``None`` on the CPU."""
    return int(torch.cuda.memory_stats().get("num_alloc_retries", 0)) if scale.gpu else None


def free_cuda() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_or_out_of_memory(fn: Callable[[], Any]) -> tuple[Any, str | None]:
    """``(fn(), None)``, or ``(None, the error's first line)`` where ``fn`` ran out of device memory: a peer that does
    not fit on this card is reported, not timed. The error and its traceback's frames (and every tensor they held) are
    dropped and the caching allocator emptied before this returns, so the rest of the session has the card's memory
    back; a pytest failure would keep the traceback, and the next bench would run out of memory too."""
    try:
        return fn(), None
    except torch.OutOfMemoryError as e:
        message = str(e).split(". ")[0].strip()
    free_cuda()
    return None, message


def skip_out_of_memory(results: "Collector", group: str, scale: Scale, who: str, message: str, **row: Any) -> NoReturn:
    """Report a peer that ran out of device memory (``run_or_out_of_memory``'s message): a row of ``group``'s table
    with ``row``'s keys and the message, a note naming the device, then a skip of the test that gives the cause."""
    where = torch.cuda.get_device_name() if scale.gpu else "the CPU"
    results.add(group, **row, out_of_memory=message)
    results.note(group, f"{who}: ran out of device memory on {where} ({message}); not timed.")
    pytest.skip(f"{who} does not fit on this device ({message}): reported in the {group} table, not timed")


def hf_model(cfg: ModelConfig, weights: dict[str, torch.Tensor], scale: Scale):
    """transformers' ``Qwen3ForCausalLM`` (SDPA attention) with the same weights: bf16 on the GPU
    (built directly on the device, then the state dict copied in), fp32 on the CPU."""
    import transformers
    dtype = torch.bfloat16 if scale.gpu else torch.float32
    hc = transformers.Qwen3Config(**cfg.to_hf_dict(), attn_implementation="sdpa")
    with torch.device(scale.device):
        try:
            m = transformers.Qwen3ForCausalLM._from_config(hc, dtype=dtype)
        except TypeError:         # transformers that only knows ``torch_dtype``
            m = transformers.Qwen3ForCausalLM._from_config(hc, torch_dtype=dtype)
    if m.dtype != dtype:          # a transformers that ignored ``dtype``
        m = m.to(dtype)
    missing, unexpected = m.load_state_dict(weights, strict=False)
    assert not unexpected, f"transformers model does not know {unexpected}"
    allowed = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    assert set(missing) <= allowed, f"transformers model lacks {missing}"
    if cfg.tie_word_embeddings:
        m.tie_weights()
        assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr(), "HF head is not tied"
    m.eval()
    m.turnkv_sdpa = scale.peer_sdpa                # the SDPA backends ``hf_generate`` lets it pick
    m.generation_config.eos_token_id = None       # fixed lengths: nothing stops early
    m.generation_config.pad_token_id = 0
    for attr in ("temperature", "top_p", "top_k"):  # greedy: silence sampling-parameter warnings
        if hasattr(m.generation_config, attr):
            setattr(m.generation_config, attr, None)
    return m


class HFStepClock:
    """A logits processor that stamps the host clock (after a device sync) at every generation step:
    consecutive stamps are one decode step apart; the first comes right after the prefill."""

    def __init__(self, scale: Scale) -> None:
        self.scale = scale
        self.stamps: list[float] = []

    def __call__(self, input_ids, scores):
        self.scale.sync()
        self.stamps.append(time.perf_counter())
        return scores

    def step_times(self) -> list[float]:
        return [b - a for a, b in zip(self.stamps, self.stamps[1:])]


def sdpa_backends(names: str | None):
    """A context that lets SDPA pick only among ``names`` (comma-separated ``SDPBackend`` members, e.g.
    ``flash_attention,efficient_attention,math``: every backend but cuDNN's); torch's own choice when ``None``.
    Unknown names raise ``ValueError``."""
    if not names:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    known = sorted(m.lower() for m in dir(SDPBackend) if m.isupper() and m != "ERROR")
    picked = [n.strip().lower() for n in names.split(",")]
    unknown = [n for n in picked if n not in known]
    if unknown:
        raise ValueError(f"unknown SDPA backend(s) {unknown}; known: {', '.join(known)}")
    return sdpa_kernel([getattr(SDPBackend, n.upper()) for n in picked])


def peer_sdpa(option: str) -> str | None:
    """A ``--hf-sdpa`` / ``--sdpa`` option's value as ``Scale.peer_sdpa``: ``torch`` (or empty) is torch's own choice
    (``None``), anything else the backends ``sdpa_backends`` takes, checked (unknown names raise ``ValueError``)."""
    names = None if option in ("torch", "") else option
    sdpa_backends(names)
    return names


def hf_generate(model, ids: torch.Tensor, new_tokens: int, cache=None, clock: HFStepClock | None = None):
    """Greedy ``generate`` with an explicit attention mask and fixed length, under the SDPA backends ``hf_model`` was
    given (its scale's ``peer_sdpa``); returns (sequences, cache)."""
    import transformers
    kw: dict[str, Any] = {}
    if cache is not None:
        kw["past_key_values"] = cache
    if clock is not None:
        kw["logits_processor"] = transformers.LogitsProcessorList([clock])
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.inference_mode(), sdpa_backends(getattr(model, "turnkv_sdpa", None)):
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, return_dict_in_generate=True, **kw)
    new_cache = getattr(out, "past_key_values", None)
    if new_cache is None:
        new_cache = getattr(out, "cache", None)
    return out.sequences, new_cache


class StepRecorder:
    """Times every engine step (``EngineCore._step``) and records its kind, batch size and the
    cached context it attended over. Wraps the instance's methods; ``close()`` restores them."""

    def __init__(self, engine, scale: Scale) -> None:
        self.engine, self.scale = engine, scale
        self.steps: list[dict] = []
        self._orig_step, self._orig_exec = engine._step, engine._execute
        self._pending: dict | None = None

        def execute(batch):
            self._pending = {"kind": batch.kind, "batch": len(batch.seqs), "tokens": batch.num_tokens,
                             "ctx": int(batch.seq_lens.sum())}
            return self._orig_exec(batch)

        def step():
            self._pending = None
            t0 = time.perf_counter()
            self._orig_step()
            dt = time.perf_counter() - t0       # every step ends with a device-to-host copy of the tokens
            if self._pending is not None:
                self.steps.append({**self._pending, "s": dt})

        engine._execute, engine._step = execute, step

    def close(self) -> None:
        self.engine._step, self.engine._execute = self._orig_step, self._orig_exec

    def __enter__(self) -> "StepRecorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def of(self, kind: str) -> list[dict]:
        return [s for s in self.steps if s["kind"] == kind]


def weight_bytes_per_step(cfg: ModelConfig, elem: int = 2) -> int:
    """Weight bytes one decode step reads: every weight once, the embedding table excluded except as
    the (tied or untied) LM head."""
    shapes = expected_shapes(cfg)
    n = sum(math.prod(s) for k, s in shapes.items() if k != "model.embed_tokens.weight")
    if cfg.tie_word_embeddings:
        n += cfg.vocab_size * cfg.hidden_size
    return n * elem


def kv_bytes_per_token(cfg: ModelConfig, elem: int = 2) -> int:
    """K and V of one token over all layers: 2 x layers x n_kv x D x elem."""
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * elem


def agreement(a: list[list[int]], b: list[list[int]]) -> dict[str, float]:
    """First-token agreement and matched-prefix share of two sets of token streams."""
    if not a:
        return {"first_token": 1.0, "prefix_share": 1.0, "identical": 1.0}
    first = sum(1 for x, y in zip(a, b) if x[:1] == y[:1]) / len(a)
    tot = match = ident = 0
    for x, y in zip(a, b):
        n = min(len(x), len(y))
        k = 0
        while k < n and x[k] == y[k]:
            k += 1
        tot += n
        match += k
        ident += int(k == n)
    return {"first_token": first, "prefix_share": match / max(1, tot), "identical": ident / len(a)}
