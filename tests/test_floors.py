"""``benches/floors.py``: the floor-and-achieved table of docs/performance.md, built from a bench run's JSON.

Checked against the fortieth session's H200 files: each row carries its record's own numbers, and the
worst and best ratios the table shows are the ones the benches computed for their targets independently.
"""

from __future__ import annotations

import importlib
import json
import pathlib
import sys

import pytest

BENCHES = pathlib.Path(__file__).resolve().parents[1] / "benches"
RUN = BENCHES / "results" / "h200" / "fortieth_session"
# the benches import each other by file name (their folder is on the path when pytest runs them)
sys.path.insert(0, str(BENCHES))
_bench = importlib.import_module("_bench")
floors = importlib.import_module("floors")
agentic = importlib.import_module("test_agentic")
sys.path.remove(str(BENCHES))
GROUPS, FloorRow, floor_rows, floors_markdown, load_groups, main = (
    floors.GROUPS, floors.FloorRow, floors.floor_rows, floors.floors_markdown, floors.load_groups, floors.main)


@pytest.fixture(scope="module")
def run() -> tuple[dict, dict]:
    return load_groups(RUN)


def _targets(group: str) -> list[dict]:
    return json.loads((RUN / f"{group}.json").read_text())["targets"]


def test_rows_carry_their_records_numbers(run) -> None:
    groups, _ = run
    assert set(groups) == set(GROUPS) - {"agentic"}          # the fortieth session did not run the agentic bench
    rows = floor_rows(groups)
    counts = {name: len(r) for name, r in rows.items()}
    print("rows per group:", counts)
    # every batch x context of the decode lab, every chunk x prefix of the prefill lab, the seven small
    # kernels at 64 rows and at their largest, the five GEMMs at M = 1 and 16, both models at five batches
    assert counts == {"kernel_decode": 12, "kernel_prefill": 12, "kernel_small": 14, "kernel_gemm": 10,
                      "engine_decode": 10}
    dec = {r.problem: r for r in rows["kernel_decode"]}
    rec = next(r for r in groups["kernel_decode"] if (r["batch"], r["ctx"], r["impl"]) == (32, 16384, "turnkv auto"))
    assert (dec["32 × 16384"].floor_ms, dec["32 × 16384"].achieved_ms) == (rec["floor_ms"], rec["median_ms"])


def test_ratios_are_the_benches_own(run) -> None:
    rows = floor_rows(run[0])
    # decode attention against cuDNN: the lab's "worst case, all contexts" target
    worst_decode = min(r.peer_over_ours for r in rows["kernel_decode"])
    assert worst_decode == pytest.approx(_targets("kernel_decode")[1]["value"], rel=1e-9)
    # paged prefill against flash: the lab's worst-case target
    worst_prefill = min(r.peer_over_ours for r in rows["kernel_prefill"])
    assert worst_prefill == pytest.approx(_targets("kernel_prefill")[0]["value"], rel=1e-9)
    # engine decode: qwen3-0.6b batch 32 x transformers, qwen3-8b batch 1 % of roofline, qwen3-8b batch 32 x
    eng = {r.problem: r for r in rows["engine_decode"]}
    t = {x["target"]: x["value"] for x in _targets("engine_decode")}
    assert eng["qwen3-0.6b, batch 32"].peer_over_ours == pytest.approx(
        t["qwen3-0.6b decode at batch 32: x transformers"], rel=1e-9)
    assert eng["qwen3-8b, batch 1"].pct_of_floor == pytest.approx(
        t["qwen3-8b decode at batch 1: % of the memory roofline"], rel=1e-9)
    assert eng["qwen3-8b, batch 32"].peer_over_ours == pytest.approx(
        t["qwen3-8b decode at batch 32: x transformers"], rel=1e-9)


def test_markdown_and_cli(run, tmp_path, capsys) -> None:
    text = floors_markdown(*run)
    assert "| decode attention (turnkv auto) | 32 × 16384 | 516 µs | 477 µs | 108.3% | SDPA cuDNN, dense 466 µs | " \
           "0.977× |" in text
    assert "| decode step (turnkv) | qwen3-8b, batch 1 | 3.634 ms | 4.185 ms | 86.8% |" in text
    assert "Not in this run, or with no floor recorded: agentic." in text
    assert main([str(RUN), "--out-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / n) for n in ("floors.md", "floors.json", "floors.png")]
    out = tmp_path / "floors.md"
    assert out.read_text() == floors_markdown(*run, source=f"`{RUN.as_posix()}`")
    assert main([str(RUN)]) == 0
    assert capsys.readouterr().out == out.read_text()
    data = json.loads((tmp_path / "floors.json").read_text())
    rows = [r for rs in floor_rows(run[0]).values() for r in rs]
    assert len(data["rows"]) == len(rows) == 58
    assert [(d["kernel"], d["problem"], d["floor_ms"], d["achieved_ms"]) for d in data["rows"]] == \
        [(r.kernel, r.problem, r.floor_ms, r.achieved_ms) for r in rows]
    assert (tmp_path / "floors.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_write_reports_adds_the_table(tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHES))   # write_reports imports floors.py beside it
    col = _bench.Collector()
    col.add("kernel_small", kernel="rmsnorm", n=64, shape="[64, 4096]", median_ms=0.004, floor_ms=0.001)
    col.add("ceilings", kind="copy", GBps=4000.0)
    written = _bench.write_reports(col, tmp_path, _bench.Scale("cpu"))
    assert {tmp_path / n for n in ("floors.md", "floors.json", "floors.png")} <= set(written)
    assert json.loads((tmp_path / "floors.json").read_text())["rows"][0]["pct_of_floor"] == pytest.approx(25.0)
    text = (tmp_path / "floors.md").read_text()
    assert "| `rmsnorm` | 64 rows | 1.0 µs | 4.0 µs | 25.0% | – | – |" in text
    assert f"(scale cpu; transformers' SDPA backends: {_bench.PEER_SDPA})." in text   # the peer column's peer
    assert "Not in this run, or with no floor recorded: kernel_decode, kernel_prefill, kernel_gemm, engine_decode, " \
           "agentic." in text


def test_no_table_without_its_groups(tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHES))
    col = _bench.Collector()
    col.add("ceilings", kind="copy", GBps=4000.0)
    written = _bench.write_reports(col, tmp_path, _bench.Scale("cpu"))
    assert not (tmp_path / "floors.md").exists() and written
    with pytest.raises(ValueError, match="no bench group"):
        floors_markdown({})


@pytest.mark.parametrize("floor, achieved", [(0.0, 1.0), (1.0, 0.0), (-1.0, 1.0), (float("nan"), 1.0)])
def test_row_rejects_times_that_are_not_positive(floor, achieved) -> None:
    with pytest.raises(ValueError, match="positive times"):
        FloorRow("k", "p", floor, achieved, "", None)


def test_agentic_rows() -> None:
    # the thirty-ninth session's run recorded no floor: no row, and the table says so
    old = json.loads((RUN.parent / "thirty_ninth_session" / "agentic.json").read_text())["records"]
    assert floor_rows({"agentic": old}) == {"agentic": []}
    text = floors_markdown({"agentic": old, "kernel_small": [dict(kernel="rmsnorm", n=64, median_ms=0.004, floor_ms=0.001)]})
    assert text.rstrip().endswith("no floor recorded: kernel_decode, kernel_prefill, kernel_gemm, engine_decode, agentic.")
    # with one: the whole run and its first and last turns, against transformers reusing its cache
    resume = dict(old[0], floor_s=5.0, turn_floor_s=[0.4] + [0.5] * 6 + [0.9])
    rows = floor_rows({"agentic": [resume, *old[1:]]})["agentic"]
    assert [r.problem for r in rows] == ["whole run", "turn 1", "turn 8"]
    assert rows[0].achieved_ms == pytest.approx(old[0]["wall_s"] * 1e3) and rows[0].floor_ms == 5000.0
    assert rows[0].peer_over_ours == pytest.approx(old[0]["speedup_vs_hf_cache"])
    assert (rows[2].floor_ms, rows[2].achieved_ms) == (900.0, old[0]["turn_s"][-1] * 1e3)
    assert "| agentic workload (resume) | whole run | 5.000 s | 6.178 s | 80.9% |" in floors_markdown({"agentic": [resume]})


def test_agentic_floor_model() -> None:
    """``turn_floors`` on the bench's GPU workload at the thirty-seventh session's copy ceiling (4250 GB/s) gives the
    decode floor that session's profile summed step by step: 5002 ms (docs/performance/agentic.md)."""
    from reference import named_config
    assert named_config("qwen3-0.6b").tie_word_embeddings     # the LM head is the embedding: not in the layers' count
    f = agentic.turn_floors(named_config("qwen3-0.6b"), 4250.0, 780.0, 64, 1024, 256, 128, 8)
    decode = sum(t["decode_s"] for t in f)
    print(f"decode floor {decode * 1e3:.1f} ms; turns {[round(t['floor_s'], 3) for t in f]}")
    assert round(decode * 1e3) == 5002
    assert [(t["first_keys"], t["last_keys"]) for t in (f[0], f[-1])] == [(1281, 1407), (3969, 4095)]
    assert [(t["context"], t["prefilled"]) for t in (f[0], f[1], f[-1])] == [(1280, 1280), (1664, 257), (3968, 257)]
    # the prefills' FLOPs, counted here from the config's fields: every layer's q, k, v, o, gate, up and down weights
    # and its four norms, the final norm, twice a token; the (tied) LM head twice a sequence; 4 * heads * head_dim a
    # layer per causal query-key pair
    cfg = named_config("qwen3-0.6b")
    H, I, L, D, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.head_dim, cfg.vocab_size
    nq, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    per_layer = H * nq * D + 2 * H * nkv * D + nq * D * H + 3 * H * I + 2 * H + 2 * D
    linear = L * per_layer + H

    def flops(new: int, start: int) -> int:
        pairs = sum(start + t for t in range(1, new + 1))
        return 64 * (2 * linear * new + 2 * V * H + 4 * L * nq * D * pairs)

    assert f[0]["prefill_s"] * 780e12 == pytest.approx(flops(1280, 0), rel=1e-12)
    assert f[7]["prefill_s"] * 780e12 == pytest.approx(flops(257, 1024 + 8 * 256 + 7 * 128 - 257), rel=1e-12)
    assert all(f[k]["prefill_s"] < f[k + 1]["prefill_s"] < f[0]["prefill_s"] for k in range(1, 7))
    assert all(f[k]["floor_s"] < f[k + 1]["floor_s"] for k in range(7))


def test_the_overview_shows_the_runs_table(run) -> None:
    """docs/performance.md's table is the one this module writes from the fortieth session's files, row for row."""
    overview = (BENCHES.parent / "docs" / "performance.md").read_text().splitlines()
    table = [line for line in floors_markdown(*run).splitlines() if line.startswith("| ")]
    start = overview.index(table[0])                    # the "| kernel | problem | ..." header
    end = next(i for i in range(start, len(overview)) if not overview[i].startswith("| "))
    assert len(table) == 60 and overview[start:end] == table, \
        "the overview's floor table differs from benches/floors.py's output"


def test_a_broken_record_costs_only_the_floor_table(tmp_path, monkeypatch, capsys) -> None:
    """A lab record without its floor: the groups' reports and the summary are written, and floors.md says what failed."""
    monkeypatch.syspath_prepend(str(BENCHES))
    col = _bench.Collector()
    col.add("kernel_small", kernel="rmsnorm", n=64, shape="[64, 4096]", median_ms=0.004)    # no floor_ms
    written = _bench.write_reports(col, tmp_path, _bench.Scale("cpu"))
    assert {tmp_path / n for n in ("kernel_small.json", "summary.json", "latest.md", "floors.md")} <= set(written)
    assert "could not build the table: KeyError: 'floor_ms'" in (tmp_path / "floors.md").read_text()
    assert "could not build the table" in capsys.readouterr().err
    assert not (tmp_path / "floors.png").exists()


def test_one_turn_gives_one_turn_row() -> None:
    rec = dict(variant="resume", wall_s=2.0, turn_s=[2.0], floor_s=1.0, turn_floor_s=[1.0])
    assert [r.problem for r in floor_rows({"agentic": [rec]})["agentic"]] == ["whole run", "turn 1"]
