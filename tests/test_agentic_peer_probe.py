"""The host side of ``benches/gpu/profile_agentic_peer.py``, on the CPU: the GPU's busy time as the union of the
profile's kernel intervals (overlaps counted once, gaps not at all, CPU records left out), and a dry run of the whole
script on the bench's CPU workload, which must print one row per turn and round with the same tokens from the plain and
the profiled run. Every bench report names the host's CPU, since such a peer runs as fast as that CPU lets it."""

from __future__ import annotations

import importlib
import pathlib
import sys
import types

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
for sub in ("benches", "benches/gpu"):
    sys.path.insert(0, str(ROOT / sub))
peer = importlib.import_module("profile_agentic_peer")
_bench = importlib.import_module("_bench")
agentic = importlib.import_module("test_agentic")
for sub in ("benches", "benches/gpu"):
    sys.path.remove(str(ROOT / sub))

CUDA, CPU = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU


def record(start_us: float, end_us: float, device=CUDA):
    return types.SimpleNamespace(device_type=device, time_range=types.SimpleNamespace(start=start_us, end=end_us))


class Profile:
    def __init__(self, records) -> None:
        self.records = records

    def events(self):
        return self.records


@pytest.mark.parametrize("records, busy_us, kernels", [
    ([], 0.0, 0),
    ([record(0, 10), record(20, 25)], 15.0, 2),                       # a gap between two kernels is idle
    ([record(20, 25), record(0, 10)], 15.0, 2),                       # order of the records does not matter
    ([record(0, 10), record(5, 15)], 15.0, 2),                        # an overlap counts once
    ([record(0, 30), record(5, 15), record(10, 12)], 30.0, 3),        # a kernel inside another adds nothing
    ([record(0, 10), record(10, 20)], 20.0, 2),                       # back to back
    ([record(0, 10), record(0, 100, CPU)], 10.0, 1),                  # host records are not GPU time
])
def test_busy_time_is_the_union_of_the_kernels(records, busy_us, kernels):
    busy, n = peer.busy_seconds(Profile(records))
    assert n == kernels, f"kernels: {n} != {kernels}"
    assert busy == pytest.approx(busy_us / 1e6), f"busy: {busy} s != {busy_us} us"


def test_dry_run_prints_a_row_per_turn_and_round(monkeypatch, capsys):
    calls = []
    real = peer.hf_generate

    def recording(model, ids, new_tokens, cache=None):
        calls.append((ids.shape[1], new_tokens, cache is not None))
        return real(model, ids, new_tokens, cache=cache)

    monkeypatch.setattr(peer, "hf_generate", recording)
    monkeypatch.setattr(sys, "argv", ["profile_agentic_peer.py", "--scale", "cpu", "--turns", "2", "--rounds", "2",
                                      "--sdpa", "math"])
    assert peer.main() == 0
    # each turn's runs (plain, profiled; two rounds) start from the same input and cache; turn 2's input is turn 1's
    # tokens and its observation, over turn 1's cache
    p, o, g, w = agentic.PROMPT["cpu"], agentic.OBS["cpu"], agentic.GEN["cpu"], agentic.WARM_GEN
    assert calls == [(p + o, w, False), (p + o + w + o, w, True)] + [(p + o, g, False)] * 4 + \
        [(p + o + g + o, g, True)] * 4, calls
    out = capsys.readouterr().out
    assert "turn 1, first profile: the 0 kernels of most GPU time" in out, "the kernel list is missing"
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [tuple(r.split("|")[1:3]) for r in rows] == [(" 1 ", " 1 "), (" 1 ", " 2 "), (" 2 ", " 1 "), (" 2 ", " 2 ")]
    for r in rows:
        wall, busy = (float(x) for x in r.split("|")[3:5])
        assert wall > 0 and busy == 0.0, f"CPU dry run: wall {wall}, busy {busy} (no kernel records on the CPU)"


def test_reports_name_the_host_cpu_and_the_peers_sdpa_backends():
    env = _bench.environment(_bench.Scale("cpu"))
    assert env["host_cpu"] and env["host_cpu"] == _bench.host_cpu(), f"environment: {env.get('host_cpu')!r}"
    assert env["peer_sdpa"] == _bench.PEER_SDPA
    assert _bench.environment(_bench.Scale("cpu", peer_sdpa=None))["peer_sdpa"] == "torch's choice"
    line = _bench.group_markdown("g", _bench.Collector().group("g"), env, "cmd").splitlines()[2]
    assert f"host CPU {env['host_cpu']} (scale `cpu`" in line, line
    assert f"its SDPA backends: {_bench.PEER_SDPA};" in line, line


def test_an_unknown_sdpa_backend_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="unknown SDPA backend"):
        _bench.sdpa_backends("flash_attention,fastest")
    with _bench.sdpa_backends("flash_attention,math"):
        pass
    assert _bench.peer_sdpa("torch") is None and _bench.peer_sdpa("") is None      # torch's own choice
    assert _bench.peer_sdpa(_bench.PEER_SDPA) == _bench.PEER_SDPA
    with pytest.raises(ValueError, match="unknown SDPA backend"):
        _bench.peer_sdpa("cudnn")
    monkeypatch.setattr(sys, "argv", ["profile_agentic_peer.py", "--scale", "cpu", "--sdpa", "cudnn"])
    with pytest.raises(SystemExit, match="--sdpa: unknown SDPA backend"):
        peer.main()


def test_the_peer_runs_under_its_scales_sdpa_backends():
    """``hf_generate`` runs transformers under the backends of the scale ``hf_model`` was built with: on the CPU, which
    has no memory-efficient SDPA kernel, a peer limited to that backend fails, and the benches' default (every backend
    but cuDNN's) and torch's own choice give the same tokens."""
    tokens = {}
    for sdpa in (_bench.PEER_SDPA, None, "efficient_attention"):
        work = agentic.Workload(_bench.Scale("cpu", peer_sdpa=sdpa))
        ids, _ = work.peer_inputs(1)
        if sdpa == "efficient_attention":
            with pytest.raises(RuntimeError, match="No viable backend"):
                _bench.hf_generate(work.hf(), ids, 3)
        else:
            tokens[sdpa] = _bench.hf_generate(work.hf(), ids, 3)[0]
        work.close()
    assert torch.equal(tokens[_bench.PEER_SDPA], tokens[None]), "the peer's tokens moved with its SDPA backends"


def test_kernel_list_reads_fields_the_profiler_has(monkeypatch):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(8).add_(1.0)
    rows = prof.key_averages()
    assert len(rows) > 0
    for e in rows:     # the fields top_kernels reads (a GPU profile's kernel rows are of the same type)
        assert isinstance(e.key, str) and e.count >= 1 and e.device_time_total >= 0, e
    assert peer.top_kernels(prof, 5) == []                 # no kernel rows on the CPU
    monkeypatch.setattr(torch.autograd, "DeviceType", types.SimpleNamespace(CUDA=CPU))   # CPU rows as if kernels
    tops = peer.top_kernels(prof, 2)
    assert 1 <= len(tops) <= 2 and all(len(t) == 3 for t in tops)
    assert [t[2] for t in tops] == sorted((t[2] for t in tops), reverse=True), tops


def _collect_benches(*args: str):
    import subprocess
    return subprocess.run([sys.executable, "-m", "pytest", "benches", "--collect-only", "-p", "no:cacheprovider",
                           "--bench-scale", "cpu", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_benches_refuse_an_unknown_peer_backend():
    """``--hf-sdpa`` is checked when the bench session starts: an unknown backend is a usage error, before any bench;
    ``torch`` (torch's own choice) is accepted and named in the session's header."""
    r = _collect_benches("--hf-sdpa", "flash_attention,fastest")
    assert r.returncode == 4, (r.returncode, r.stdout[-500:], r.stderr[-500:])
    assert "--hf-sdpa: unknown SDPA backend(s) ['fastest']" in r.stderr, r.stderr[-500:]
    r = _collect_benches("--hf-sdpa", "torch")
    assert r.returncode == 0, (r.returncode, r.stdout[-500:], r.stderr[-500:])
    assert "transformers' SDPA backends: torch" in r.stdout, r.stdout[:500]
