"""Floor and achieved, kernel by kernel: one table from a bench run's JSON files.

Issue 5 asks for two numbers per kernel: its **floor** (the fewest bytes it must move over the copy
ceiling, or the FLOPs over the bf16 GEMM ceiling, both measured in the same run) and what it
**achieved**. Every lab records both per problem (``floor_ms`` beside ``median_ms``, or ``step_ms`` for
a decode step), and the agentic bench its workload's (``floor_s``, ``turn_floor_s``: ``test_agentic.turn_floors``);
this module picks the problems the docs discuss and lays them out side by side, with the peer each target names.

    python benches/floors.py benches/results/h200/fortieth_session     # markdown on stdout
    python benches/floors.py DIR --out-dir DIR       # floors.md, floors.json, floors.png

``write_reports`` (``benches/_bench.py``) writes the three beside the groups' reports of every run
that produced one of these groups, so the next GPU run brings its own table and plot.

"% of floor" is floor / achieved: 100% is a kernel at its floor. It can pass 100% where the
floor's ceiling is a device-to-device copy (reads and writes) and the kernel mostly reads.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

#: the groups this table reads, in the order of its sections
GROUPS = ("kernel_decode", "kernel_prefill", "kernel_small", "kernel_gemm", "engine_decode", "agentic")


@dataclass(slots=True, frozen=True)
class FloorRow:
    kernel: str          # what ran ("decode attention, auto")
    problem: str         # its shape ("32 × 4096")
    floor_ms: float
    achieved_ms: float
    peer: str            # the peer's name, "" when the lab has none
    peer_ms: float | None

    def __post_init__(self) -> None:
        if not (self.floor_ms > 0 and self.achieved_ms > 0):
            raise ValueError(f"{self.kernel} {self.problem}: floor and achieved must be positive times, "
                             f"got {self.floor_ms!r} and {self.achieved_ms!r}")

    @property
    def pct_of_floor(self) -> float:
        return 100.0 * self.floor_ms / self.achieved_ms

    @property
    def peer_over_ours(self) -> float | None:
        return None if self.peer_ms is None else self.peer_ms / self.achieved_ms


def _index(records: list[dict[str, Any]], *keys: str) -> dict[tuple, dict[str, Any]]:
    return {tuple(r.get(k) for k in keys): r for r in records}


def _first(records: list[dict[str, Any]], names: tuple[str, ...]) -> str | None:
    """The first of ``names`` that some record's ``impl`` carries: the GPU scale's name comes first,
    then the CPU scale's (the reference kernels and SDPA's math backend), so both scales fill the table."""
    present = {r.get("impl") for r in records}
    return next((n for n in names if n in present), None)


def _peer(impl: str) -> str:
    backend = impl.removeprefix("sdpa ")
    return f"SDPA {dict(cudnn='cuDNN').get(backend, backend)}"


def _attention(records: list[dict[str, Any]], shape: tuple[str, str], ours_names: tuple[str, ...],
               peer_names: tuple[str, ...], kernel: str, problem: Callable[[dict[str, Any]], str],
               peer_suffix: str = "") -> list[FloorRow]:
    """The attention labs' rows: ours (the first of ``ours_names`` present) at each ``shape`` key pair, sorted by it,
    beside the first of ``peer_names`` on the same problem."""
    ours, peer_name = _first(records, ours_names), _first(records, peer_names)
    by = _index(records, *shape, "impl")
    rows = []
    for key, r in sorted(by.items(), key=lambda kv: kv[0][:2]):
        if key[2] != ours:
            continue
        peer = by.get((*key[:2], peer_name))
        rows.append(FloorRow(f"{kernel} ({ours})", problem(r), r["floor_ms"], r["median_ms"],
                             _peer(peer_name) + peer_suffix if peer else "", peer["median_ms"] if peer else None))
    return rows


def _decode(records: list[dict[str, Any]]) -> list[FloorRow]:
    """Split-KV decode attention as the engine launches it (``auto``, shuffled pages) against cuDNN SDPA."""
    return _attention(records, ("batch", "ctx"), ("turnkv auto", "reference fixed:16"), ("sdpa cudnn", "sdpa math"),
                      "decode attention", lambda r: f"{r['batch']} × {r['ctx']}", ", dense")


def _prefill(records: list[dict[str, Any]]) -> list[FloorRow]:
    """Paged prefill as the engine launches it against SDPA's flash backend (the target's peer)."""
    return _attention(records, ("chunk", "prefix"), ("turnkv", "reference"), ("sdpa flash", "sdpa math"),
                      "paged prefill", lambda r: f"{r['nseq']} × {r['chunk']} after {r['prefix']}")


def _small(records: list[dict[str, Any]]) -> list[FloorRow]:
    """RMSNorm, RoPE and sampling at a decode step's rows (64) and at the lab's largest."""
    largest: dict[str, int] = {}
    for r in records:
        largest[r["kernel"]] = max(largest.get(r["kernel"], 0), r["n"])
    rows = []
    for r in records:
        if r["n"] in (64, largest[r["kernel"]]):
            rows.append(FloorRow(f"`{r['kernel']}`", f"{r['n']} rows", r["floor_ms"], r["median_ms"], "", None))
    return rows


def _gemm(records: list[dict[str, Any]]) -> list[FloorRow]:
    """The decode GEMMs on the default engine's own kernels, where the lab times them: the staged kernel
    at M = 1 (``turnkv staged``) and ``ops.gemm`` at M = 16 (steps of 9-16 rows); at the CPU scale the
    reference's row-at-a-time GEMM at both."""
    by = _index(records, "gemm", "M", "impl")
    picks = {1: _first(records, ("turnkv staged", "reference")), 16: _first(records, ("turnkv", "reference"))}
    rows = []
    for (gemm, m, impl), r in by.items():
        if m not in picks or impl != picks[m]:
            continue
        peer = by.get((gemm, m, "torch.matmul"))
        name = {"turnkv staged": "staged GEMM", "turnkv": "`ops.gemm`"}.get(impl, impl)
        rows.append(FloorRow(f"{name}, {gemm}", f"M = {m}, {r['shape'].replace(' x ', ' × ')}", r["floor_ms"],
                             r["median_ms"], "torch.matmul" if peer else "", peer["median_ms"] if peer else None))
    return rows


def _engine(records: list[dict[str, Any]]) -> list[FloorRow]:
    """A decode step (CUDA graph) against its memory roofline and transformers' step."""
    ours = _first(records, ("turnkv", "reference"))
    by = _index(records, "model", "batch", "impl")
    rows = []
    for (model, batch, impl), r in by.items():
        if impl != ours:
            continue
        peer = by.get((model, batch, "transformers"))
        rows.append(FloorRow(f"decode step ({ours})", f"{model}, batch {batch}", r["floor_ms"], r["step_ms"],
                             "transformers" if peer else "", peer["step_ms"] if peer else None))
    return rows


def _agentic(records: list[dict[str, Any]]) -> list[FloorRow]:
    """The agentic workload, the engine resuming: the whole run, its first and last turns, against the workload's
    floor (``test_agentic.turn_floors``) and transformers reusing its cache. Runs before the forty-second session
    recorded no floor and give no row."""
    by = {r.get("variant"): r for r in records}
    ours, peer = by.get("resume"), by.get("transformers + cache")
    if not ours or not ours.get("floor_s"):
        return []
    rows = [FloorRow("agentic workload (resume)", "whole run", ours["floor_s"] * 1e3, ours["wall_s"] * 1e3,
                     "transformers + cache" if peer else "", peer["wall_s"] * 1e3 if peer else None)]
    turns, floors = ours["turn_s"], ours["turn_floor_s"]
    for k in sorted({0, len(turns) - 1}):
        rows.append(FloorRow("agentic workload (resume)", f"turn {k + 1}", floors[k] * 1e3, turns[k] * 1e3,
                             "transformers + cache" if peer else "", peer["turn_s"][k] * 1e3 if peer else None))
    return rows


_PICKERS: dict[str, Callable[[list[dict[str, Any]]], list[FloorRow]]] = {
    "kernel_decode": _decode, "kernel_prefill": _prefill, "kernel_small": _small, "kernel_gemm": _gemm,
    "engine_decode": _engine, "agentic": _agentic,
}


def floor_rows(groups: dict[str, list[dict[str, Any]]]) -> dict[str, list[FloorRow]]:
    """The table's rows, by group, from each group's records (``<group>.json``'s ``records``)."""
    return {name: _PICKERS[name](groups[name]) for name in GROUPS if name in groups}


def _time(ms: float) -> str:
    if ms >= 1e3:
        return f"{ms / 1e3:.3f} s"
    if ms < 0.1:
        return f"{ms * 1e3:.1f} µs"
    if ms < 1.0:
        return f"{ms * 1e3:.0f} µs"
    return f"{ms:.3f} ms"


def _ratio(x: float | None) -> str:
    if x is None or math.isnan(x):
        return "–"
    return f"{x:.3f}×" if x < 10 else f"{x:.1f}×"


def load_groups(results_dir: Path) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    """Records and commands of the groups present in ``results_dir`` (``<group>.json``)."""
    groups, commands = {}, {}
    for name in GROUPS:
        p = results_dir / f"{name}.json"
        if p.is_file():
            data = json.loads(p.read_text())
            groups[name] = data["records"]
            commands[name] = data.get("command", "")
    return groups, commands


def floors_markdown(groups: dict[str, list[dict[str, Any]]], commands: dict[str, str] | None = None,
                    source: str = "") -> str:
    """The markdown table (and the commands that measured it)."""
    if not groups:
        raise ValueError(f"no bench group with floors among {', '.join(GROUPS)}")
    lines = ["# Floor and achieved, kernel by kernel", ""]
    if source:
        lines += [f"From {source}.", ""]
    lines += ["Floor: the bytes a kernel must move over the copy ceiling, or its FLOPs over the bf16 GEMM ceiling "
              "(paged prefill), or a decode step's weight and KV bytes over the copy ceiling (decode step; the agentic "
              "workload's decode steps the same, its prefills' FLOPs at the GEMM ceiling), the ceilings measured in "
              "the same run. % of floor = floor / achieved.", "",
              "| kernel | problem | floor | achieved | % of floor | peer | peer / ours |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    rows_by_group = floor_rows(groups)
    for rows in rows_by_group.values():
        for r in rows:
            ratio = r.peer_over_ours
            lines.append(f"| {r.kernel} | {r.problem} | {_time(r.floor_ms)} | {_time(r.achieved_ms)} | "
                         f"{r.pct_of_floor:.1f}% | {r.peer + ' ' + _time(r.peer_ms) if r.peer_ms else '–'} | "
                         f"{_ratio(ratio)} |")
    missing = [g for g in GROUPS if g not in groups or not rows_by_group.get(g)]
    if missing:
        lines += ["", f"Not in this run, or with no floor recorded: {', '.join(missing)}."]
    if commands:
        by_command: dict[str, list[str]] = {}
        for g, c in commands.items():
            if c:
                by_command.setdefault(c, []).append(g)
        lines += ["", "Commands:"] + [f"- {', '.join(gs)}: `{c}`" for c, gs in by_command.items()]
    return "\n".join(lines) + "\n"


def floors_json(groups: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The table's rows as plain data (``floors.json``)."""
    return {"rows": [{"group": g, "kernel": r.kernel, "problem": r.problem, "floor_ms": r.floor_ms,
                      "achieved_ms": r.achieved_ms, "pct_of_floor": r.pct_of_floor, "peer": r.peer or None,
                      "peer_ms": r.peer_ms, "peer_over_ours": r.peer_over_ours}
                     for g, rows in floor_rows(groups).items() for r in rows]}


def floors_plot(groups: dict[str, list[dict[str, Any]]], path: Path, title: str = "") -> Path:
    """``floors.png``: a bar a row, its % of floor, coloured by bench group, with the peer / ours ratio at its end."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(g, r) for g, rs in floor_rows(groups).items() for r in rs]
    if not rows:
        raise ValueError("no row to plot")
    fig, ax = plt.subplots(figsize=(9.5, 1.2 + 0.2 * len(rows)))
    colours = {g: plt.get_cmap("tab10")(i) for i, g in enumerate(GROUPS)}
    y = list(range(len(rows)))[::-1]
    ax.barh(y, [r.pct_of_floor for _, r in rows], color=[colours[g] for g, _ in rows], height=0.7)
    for yy, (_, r) in zip(y, rows):
        if r.peer_over_ours is not None:
            ax.annotate(f"{_ratio(r.peer_over_ours)} {r.peer}", (r.pct_of_floor, yy), xytext=(3, 0),
                        textcoords="offset points", va="center", fontsize=6)
    ax.set_yticks(y)
    ax.set_yticklabels([f"{r.kernel}, {r.problem}".replace("`", "") for _, r in rows], fontsize=6)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.axvline(100, ls="--", lw=1, color="grey")
    ax.set_xlim(0, max(130.0, 1.25 * max(r.pct_of_floor for _, r in rows)))
    ax.set_xlabel("% of floor (floor / achieved); beside each bar: peer time / ours")
    ax.set_title(title or "Floor and achieved, kernel by kernel", fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_floors(groups: dict[str, list[dict[str, Any]]], out_dir: Path, commands: dict[str, str] | None = None,
                 source: str = "") -> list[Path]:
    """``floors.md``, ``floors.json`` and ``floors.png`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js, png = out_dir / "floors.md", out_dir / "floors.json", out_dir / "floors.png"
    md.write_text(floors_markdown(groups, commands, source))
    js.write_text(json.dumps({"source": source, "commands": commands or {}, **floors_json(groups)}, indent=1))
    paths = [md, js]
    if any(floor_rows(groups).values()):
        paths.append(floors_plot(groups, png, f"Floor and achieved ({source})" if source else ""))
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results_dir", type=Path, help="a folder of <group>.json files written by the benches")
    ap.add_argument("--out-dir", type=Path, help="write floors.md, floors.json and floors.png here instead of "
                                                  "printing the markdown")
    args = ap.parse_args(argv)
    groups, commands = load_groups(args.results_dir)
    source = f"`{args.results_dir.as_posix()}`"
    if args.out_dir:
        for p in write_floors(groups, args.out_dir, commands, source):
            print(p)
    else:
        print(floors_markdown(groups, commands, source=source), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
