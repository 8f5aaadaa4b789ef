"""Where the agentic workload's time goes, turn by turn: the GPU's busy and idle time, the prefill and the
decode steps, against the decode steps' memory floor.

    python benches/gpu/profile_agentic.py [--turns 8] [--out DIR] [--cprofile] [--prefill-ab ROUNDS]
        [--trickle-ab ROUNDS [--trickle TURNS OBS GROUP STEPS]] [--no-profile]

Diagnostic, not a benchmark of record (the numbers of record are ``benches/test_agentic.py``). The
workload is that bench's (``test_agentic.Workload``: qwen3-0.6b, 64 sequences, prompt 1024, turns of
observation 256 and generation 128, greedy, random weights), the engine resuming. It runs once to warm
up (two short turns, as the bench does), once timed (the bench's per-turn wall clock), and once under
``torch.profiler``. In the profiled run every turn and every engine step is a host range
(``record_function``); each kernel belongs to the step whose host range launched it (the launch's
correlation id: a graph replay's kernels belong to the ``cudaGraphLaunch``). Per turn it prints:

* the host wall time of the turn, the GPU's busy time (the union of the kernels' intervals) and idle time,
  split into before the first kernel, after the last kernel, and the gaps between kernels;
* the prefill steps (count, tokens, GPU span: first kernel start to last kernel end) and the decode
  steps (count, summed and median span, the median gap between two decode steps);
* the decode steps' floor: weights + the batch's K/V bytes over the copy ceiling measured here, at the
  turn's mean context, and the % of it the median decode span reaches.

A lookahead step that the engine drops is launched inside the step before it, so its kernels count in
that step's span; the decode steps' count is the host's.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benches")]

from _bench import Scale, free_cuda, kv_bytes_per_token, weight_bytes_per_step  # noqa: E402
from _ceilings import measure_ceilings  # noqa: E402
import test_agentic as ag  # noqa: E402



def _instrument(eng) -> list[dict]:
    """Wrap the engine's step in a host range named by its kind and size; returns the step log."""
    from torch.profiler import record_function
    log: list[dict] = []
    schedule = eng.scheduler.schedule
    step = eng._step

    def logged_schedule():
        batch = schedule()
        if batch is not None:
            log.append({"kind": batch.kind, "tokens": batch.num_tokens, "rows": len(batch.seqs),
                        "ctx": float(batch.seq_lens.mean())})
        return batch

    def ranged_step():
        n = len(log)
        with record_function(f"turnkv_step {n}"):
            step()

    eng.scheduler.schedule = logged_schedule
    eng._step = ranged_step
    return log


def _trace(prof) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        return json.loads(Path(f.name).read_text())


def _union(iv: list[tuple[float, float]]) -> float:
    busy, end = 0.0, float("-inf")
    for a, b in sorted(iv):
        if b <= end:
            continue
        busy += b - max(a, end)
        end = b
    return busy


def analyse(trace: dict, log: list[dict], floor_ms, turns: int) -> list[dict]:
    ev = trace["traceEvents"]
    ranges = {}                          # name -> (start, end) of the host ranges
    for e in ev:
        if e.get("ph") == "X" and e.get("cat") == "user_annotation":
            n = e["name"]
            if n.startswith(("turnkv_step ", "turnkv_turn ")):
                ranges[n] = (e["ts"], e["ts"] + e["dur"])
    launches = {}                        # correlation -> host timestamp of the launch
    for e in ev:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launches[e["args"]["correlation"]] = e["ts"]
    kernels = sorted((e["ts"], e["ts"] + e["dur"], e["name"], e["args"].get("correlation")) for e in ev
                     if e.get("ph") == "X" and e.get("cat") == "kernel")
    steps = sorted((r[0], r[1], int(n.split()[1])) for n, r in ranges.items() if n.startswith("turnkv_step "))
    starts = [s[0] for s in steps]
    by_step: dict[int, list] = {}
    for k in kernels:
        t = launches.get(k[3])
        if t is None:
            continue
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and t <= steps[i][1]:
            by_step.setdefault(steps[i][2], []).append(k)
    out = []
    for k in range(turns):
        t0, t1 = ranges[f"turnkv_turn {k + 1}"]
        ks = [x for x in kernels if x[0] >= t0 and x[1] <= t1 + 1]
        busy = _union([(a, b) for a, b, *_ in ks])
        first, last = (ks[0][0], max(b for _, b, *_ in ks)) if ks else (t0, t0)
        idx = [s[2] for s in steps if t0 <= s[0] <= t1]
        pre = [i for i in idx if log[i]["kind"] == "prefill"]
        dec = [i for i in idx if log[i]["kind"] == "decode"]

        def span(i):
            kk = by_step.get(i, [])
            return (max(b for _, b, *_ in kk) - min(a for a, *_ in kk)) if kk else 0.0

        dec_spans = [span(i) for i in dec if by_step.get(i)]
        dec_gaps = []
        for a, b in zip(dec, dec[1:]):
            ka, kb = by_step.get(a), by_step.get(b)
            if ka and kb:
                dec_gaps.append(min(x[0] for x in kb) - max(x[1] for x in ka))
        host = {s[2]: (s[0], s[1]) for s in steps if t0 <= s[0] <= t1}
        detail = []                                   # the turn's first four steps and its last one
        for j, i in enumerate(idx):
            if j >= 4 and j != len(idx) - 1:
                continue
            kk = by_step.get(i, [])
            nxt = by_step.get(idx[j + 1], []) if j + 1 < len(idx) else []
            a, b = host[i]
            k0 = min(x[0] for x in kk) if kk else a
            k1 = max(x[1] for x in kk) if kk else a
            detail.append(dict(step=j + 1, kind=log[i]["kind"], tokens=log[i]["tokens"], rows=log[i]["rows"],
                               host_ms=(b - a) / 1e3, kernels=len(kk), span_ms=(k1 - k0) / 1e3,
                               busy_ms=_union([(x[0], x[1]) for x in kk]) / 1e3,
                               launch_to_first_us=k0 - a, to_next_us=(min(x[0] for x in nxt) - k1) if nxt else 0.0))
        ctx = statistics.mean(log[i]["ctx"] for i in dec) if dec else 0.0
        rows = statistics.mean(log[i]["rows"] for i in dec) if dec else 0.0
        fl = floor_ms(rows, ctx) if dec else 0.0
        med = statistics.median(dec_spans) / 1e3 if dec_spans else 0.0
        out.append(dict(turn=k + 1, wall_ms=(t1 - t0) / 1e3, busy_ms=busy / 1e3, idle_ms=(t1 - t0 - busy) / 1e3,
                        head_ms=(first - t0) / 1e3, tail_ms=(t1 - last) / 1e3,
                        gaps_ms=((last - first) - busy) / 1e3, kernels=len(ks),
                        prefill_steps=len(pre), prefill_tokens=sum(log[i]["tokens"] for i in pre),
                        prefill_ms=sum(span(i) for i in pre) / 1e3,
                        decode_steps=len(dec), decode_rows=rows, decode_ctx=ctx,
                        decode_ms=sum(dec_spans) / 1e3, decode_median_ms=med,
                        decode_gap_median_us=statistics.median(dec_gaps) if dec_gaps else 0.0,
                        decode_gap_sum_ms=sum(dec_gaps) / 1e3, decode_floor_ms=fl,
                        decode_pct_floor=100 * fl / med if med else 0.0,
                        steps=detail, decode_kernels=_increments([by_step[i] for i in dec if by_step.get(i)]),
                        prefill_kernels=_increments([by_step[i] for i in pre if by_step.get(i)])))
    return out


def _increments(steps: list[list]) -> list[tuple[str, int, float]]:
    """Per kernel name over these steps: launches and the summed increment (its end less the previous
    kernel's end, within a step; PDL overlaps the durations, the increments sum to the spans), in us."""
    agg: dict[str, list] = {}
    for ks in steps:
        ks = sorted(ks)
        prev = ks[0][0]
        for _start, b, name, _ in ks:
            e = agg.setdefault(name[:70], [0, 0.0])
            e[0] += 1
            e[1] += max(0.0, b - prev)
            prev = max(prev, b)
    return sorted(((n, c, t) for n, (c, t) in agg.items()), key=lambda x: -x[2])


def run_turns(w, eng, turns: int, around) -> None:
    """The workload's turns on ``eng`` (the engine resuming, as ``test_agentic.Workload.resume``), each turn inside the
    context manager ``around(k)`` (k from 0); every turn's outputs have the workload's lengths."""
    sids = [eng.rollout_add(p + o[0], w.sp) for p, o in zip(w.prompts, w.obs)]
    for k in range(turns):
        with around(k):
            if k:
                for sid, o in zip(sids, w.obs):
                    eng.rollout_continue(sid, o[k])
            outs = eng.rollout_run_turns()
        assert all(len(outs[s].token_ids) == w.sp.max_tokens for s in sids), f"turn {k + 1}: wrong lengths"
    for sid in sids:
        eng.rollout_finish(sid)


def cprofile_prefills(w, eng, turns: int) -> None:
    """The turns once more, cProfile on only inside the prefill steps of turns 2.. (the host's share of an eager
    prefill step); prints the functions by own time and by cumulative time."""
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    step, state = eng._step, {"on": False}

    def profiled_step():
        sch = eng.scheduler                                       # the scheduler's own test for a prefill step
        prefill = bool(sch.waiting) or any(not s.prefill_done for s in sch.running)
        if state["on"] and prefill:
            prof.enable()
            try:
                step()
            finally:
                prof.disable()
        else:
            step()

    @contextlib.contextmanager
    def resumed_only(k: int):
        state["on"] = k > 0
        yield

    eng._step = profiled_step
    run_turns(w, eng, turns, resumed_only)
    eng._step = step
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(28)
        print(f"cProfile of the resumed turns' prefill steps, by {key}:")
        print("\n".join(line[:150] for line in buf.getvalue().splitlines() if line.strip()))


def _agreement(tokens: dict[str, list], names: list[str]) -> dict[str, float]:
    """Per variant, the share of the first variant's tokens it matched (``tokens[name]``: per sequence, per turn)."""
    agree = {}
    for name in names:
        same = total = 0
        for a, b in zip(tokens[name], tokens[names[0]]):
            for ta, tb in zip(a, b):
                same += sum(x == y for x, y in zip(ta, tb))
                total += len(tb)
        agree[name] = same / max(1, total)
    return agree


def _alternating(names: list[str], rounds: int) -> list[str]:
    """The order in which an A/B runs its variants: ``rounds`` rounds of all, the order reversed every other round."""
    return [name for r in range(rounds) for name in (names if r % 2 == 0 else names[::-1])]


#: ``--prefill-ab``'s variants: (``prefill_chunking``, ``runner.prefill_graph_max_tokens``); ``--prefill-variants``
#: picks some (each engine holds the whole workload's pages: about 30 GB at the GPU scale, so three at a time)
PREFILL_AB = {"even": ("even", 0), "greedy": ("greedy", 0), "greedy+graphs": ("greedy", 256),
              "even+graphs": ("even", 256)}
PREFILL_AB_DEFAULT = ("even", "greedy", "greedy+graphs")


def prefill_ab(w: "ag.Workload", rounds: int, names: list[str] | None = None) -> dict:
    """The resumed workload on the bench's clock with each of ``names`` (``PREFILL_AB``'s prefill rules; default
    ``PREFILL_AB_DEFAULT``), one engine each, in one process: each engine warmed up, then ``rounds`` rounds of all in
    turn (the order reversed every other round). ``greedy`` leaves each resumed turn a 64-token step of one sequence;
    ``greedy+graphs`` replays that step from a prefill graph; ``even+graphs`` replays the even chunks of at most 256
    tokens. Returns each variant's run totals (s) and the share of the first variant's tokens each matched (bf16:
    another cut of the same prefill may move a near tie, so the share is reported, not asserted)."""
    base = dict(ag.ENGINE_KW[w.s])
    names = list(names or PREFILL_AB_DEFAULT)
    engines, totals, tokens = {}, {m: [] for m in names}, {}
    w._engine = None                         # the profiled engine's pool and graphs go before these are built
    free_cuda()
    try:
        for name in names:
            chunking, graph_tokens = PREFILL_AB[name]
            ag.ENGINE_KW[w.s] = {**base, "prefill_chunking": chunking}
            w._engine = None
            engines[name] = w.engine()
            ag.set_prefill_graphs(engines[name], graph_tokens)
            w.warm_up("resume")
        for name in _alternating(names, rounds):
            w._engine = engines[name]
            out = w.resume(ag.TURNS[w.s], w.sp)
            totals[name].append(sum(out["turn_s"]))
            tokens[name] = out["tokens"]
        graphed = {name: ag.prefill_graph_steps(engines[name]) for name in names}
    finally:
        ag.ENGINE_KW[w.s] = base
        w._engine = None
    return {"totals_s": totals, "token_agreement": _agreement(tokens, names), "graphed_prefill_steps": graphed}


#: ``--trickle-ab``'s variants: ``runner.prefill_graph_max_tokens`` (0: every prefill step eager), the bench's
TRICKLE_AB = ag.TRICKLE_VARIANTS


def trickle_ab(w: "ag.Workload", rounds: int, turns: int, obs_len: int, group: int, steps: int) -> dict:
    """``Workload.trickle`` (``benches/test_agentic.py``) on one engine per ``TRICKLE_AB`` variant, in one process:
    each engine warmed up by one untimed run, then ``rounds`` rounds of every variant in turn (the order reversed every
    other round). Returns each variant's totals (s) with the process's CPU time and the garbage collector's time over
    each run (so a slow round shows whether the host worked more or waited), its graphed prefill steps, and the
    share of the first variant's tokens it matched (reported, not asserted: on the GPU a graphed step is padded to its
    bucket, which CPU tests find bitwise equal but which no contract fixes)."""
    names = list(TRICKLE_AB)
    gen = ag.GEN[w.s]
    engines, totals, tokens = {}, {m: [] for m in names}, {}
    cpu, gcs = {m: [] for m in names}, {m: [] for m in names}
    w._engine = None
    free_cuda()
    try:
        for name in names:
            w._engine = None
            engines[name] = w.engine()
            ag.set_prefill_graphs(engines[name], TRICKLE_AB[name])
            w.trickle(engines[name], turns, obs_len, group, steps, gen)
        for name in _alternating(names, rounds):
            out = w.trickle(engines[name], turns, obs_len, group, steps, gen)
            totals[name].append(out["wall_s"])
            cpu[name].append(out["cpu_s"])
            gcs[name].append({"s": out["gc_s"], "collections": out["gc_collections"]})
            tokens[name] = out["tokens"]
        graphed = {name: ag.prefill_graph_steps(engines[name]) for name in names}
    finally:
        w._engine = None
    return {"totals_s": totals, "cpu_s": cpu, "gc": gcs, "token_agreement": _agreement(tokens, names),
            "graphed_prefill_steps": graphed,
            "problem": {"seqs": len(w.prompts), "turns": turns, "obs_len": obs_len, "group": group, "steps": steps,
                        "gen": gen}}


def profiled(args, w: "ag.Workload", scale: Scale, floor_ms) -> dict:
    """The warm-up, the timed run and the profiled run of the workload (the engine resuming), their report printed;
    then, with ``--cprofile``, the host profile of the resumed turns' prefill steps."""
    warm = w.warm_up("resume")
    assert all(len(t) == ag.WARM_GEN for seq in warm["tokens"] for t in seq), "warm-up: wrong lengths"
    timed = w.run("resume")
    print("timed run (the bench's clock): " + "  ".join(f"{t:.3f}" for t in timed["turn_s"][:args.turns])
          + f"  total {sum(timed['turn_s']):.3f} s")

    eng = w.engine()
    log = _instrument(eng)
    from torch.profiler import ProfilerActivity, profile, record_function
    turn_s = []
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if scale.gpu else [])

    @contextlib.contextmanager
    def timed_range(k: int):                 # a host range per turn, its wall time with a device sync at each end
        scale.sync()
        t = time.perf_counter()
        with record_function(f"turnkv_turn {k + 1}"):
            yield
            scale.sync()
        turn_s.append(time.perf_counter() - t)

    with profile(activities=acts) as prof:
        run_turns(w, eng, args.turns, timed_range)
    rows = analyse(_trace(prof), log, floor_ms, args.turns)
    print("profiled run's turns (s): " + "  ".join(f"{t:.3f}" for t in turn_s))
    hdr = ("turn", "wall", "busy", "idle", "head", "tail", "gaps", "pf#", "pf tok", "pf ms", "dec#", "ctx",
           "dec ms", "med", "floor", "%fl", "gap us", "gaps ms")
    print(" ".join(f"{h:>7}" for h in hdr))
    for r in rows:
        vals = (r["turn"], r["wall_ms"], r["busy_ms"], r["idle_ms"], r["head_ms"], r["tail_ms"], r["gaps_ms"],
                r["prefill_steps"], r["prefill_tokens"], r["prefill_ms"], r["decode_steps"], r["decode_ctx"],
                r["decode_ms"], r["decode_median_ms"], r["decode_floor_ms"], r["decode_pct_floor"],
                r["decode_gap_median_us"], r["decode_gap_sum_ms"])
        print(" ".join(f"{v:>7.1f}" if isinstance(v, float) else f"{v:>7}" for v in vals))
    for r in rows:
        if r["turn"] in (2, args.turns):
            print(f"turn {r['turn']}: its first four steps and its last (host range, GPU span and busy in ms; "
                  "host range start to first kernel, last kernel to the next step's first, in us)")
            for d in r["steps"]:
                print(f"   step {d['step']:>3} {d['kind']:>7} {d['tokens']:>6} tok {d['rows']:>3} rows: host "
                      f"{d['host_ms']:8.2f}  span {d['span_ms']:8.2f}  busy {d['busy_ms']:8.2f}  kernels "
                      f"{d['kernels']:>5}  start->first {d['launch_to_first_us']:9.1f}  ->next {d['to_next_us']:9.1f}")
            for what in ("decode", "prefill"):
                ks, n = r[what + "_kernels"], max(1, r[what + "_steps"])
                print(f"turn {r['turn']}, {what} steps ({r[what + '_steps']}): per step, kernels by summed increment")
                for name, c, t in ks[:14]:
                    print(f"   {t / n:9.1f} us  {c / n:6.1f}x  {name}")
    tot = {k: sum(r[k] for r in rows) for k in ("wall_ms", "busy_ms", "idle_ms", "head_ms", "tail_ms", "gaps_ms",
                                                "prefill_ms", "decode_ms", "decode_gap_sum_ms")}
    print("totals (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in tot.items()))
    print("decode floor at each turn's mean context, summed over its steps (ms): "
          f"{sum(r['decode_floor_ms'] * r['decode_steps'] for r in rows):.1f}")
    if args.cprofile:
        cprofile_prefills(w, eng, args.turns)
    return {"timed_turn_s": timed["turn_s"], "profiled_turn_s": turn_s, "turns": rows, "steps": log}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--cprofile", action="store_true",
                    help="then run the turns again with cProfile on during the resumed turns' prefill steps")
    ap.add_argument("--scale", choices=("gpu", "cpu"), default="gpu", help="cpu: a host-only dry run of the script")
    ap.add_argument("--prefill-ab", type=int, default=0, metavar="ROUNDS",
                    help="then time the workload with each of PREFILL_AB's prefill rules, ROUNDS rounds of each")
    ap.add_argument("--prefill-variants", default=",".join(PREFILL_AB_DEFAULT), metavar="NAMES",
                    help=f"--prefill-ab's variants, comma-separated, the first the tokens' baseline "
                         f"(of {', '.join(PREFILL_AB)})")
    ap.add_argument("--trickle-ab", type=int, default=0, metavar="ROUNDS",
                    help="then time `trickle` (observations handed over a few sequences at a time) with prefill "
                         "steps eager and from prefill graphs, ROUNDS rounds of each")
    ap.add_argument("--trickle", type=int, nargs=4, default=(3, 31, 1, 2), metavar=("TURNS", "OBS", "GROUP", "STEPS"),
                    help="the trickle's turns, observation tokens, sequences a hand-over and steps between two")
    ap.add_argument("--no-profile", action="store_true", help="skip the timed and the profiled runs (A/Bs only)")
    args = ap.parse_args()
    variants = args.prefill_variants.split(",")
    if not variants or any(v not in PREFILL_AB for v in variants) or len(set(variants)) < len(variants):
        ap.error(f"--prefill-variants: distinct names of {', '.join(PREFILL_AB)}, not {args.prefill_variants!r}")
    scale = Scale(args.scale)
    ceiling = measure_ceilings(scale)["copy_GBps"]
    print(f"device {torch.cuda.get_device_name() if scale.gpu else 'cpu'}, copy ceiling {ceiling:.0f} GB/s")
    w = ag.Workload(scale)
    cfg = w.cfg
    wbytes, kv_tok = weight_bytes_per_step(cfg), kv_bytes_per_token(cfg)

    def floor_ms(rows: float, ctx: float) -> float:
        return (wbytes + rows * ctx * kv_tok) / (ceiling * 1e9) * 1e3

    args.turns = args.turns or ag.TURNS[args.scale]
    prof = None if args.no_profile else profiled(args, w, scale, floor_ms)
    ab = None
    if args.prefill_ab:
        ab = prefill_ab(w, args.prefill_ab, variants)
        print("prefill A/B (the bench's clock, whole runs in s): "
              + "; ".join(f"{m} " + " ".join(f"{t:.3f}" for t in ts) + f" (best {min(ts):.3f}, tokens matching "
                          f"{variants[0]}'s {100 * ab['token_agreement'][m]:.1f}%, "
                          f"{ab['graphed_prefill_steps'][m]} graphed prefill steps)"
                          for m, ts in ab["totals_s"].items()))
    tr = None
    if args.trickle_ab:
        turns, obs_len, group, steps = args.trickle
        tr = trickle_ab(w, args.trickle_ab, turns, obs_len, group, steps)
        print(f"trickle A/B ({tr['problem']}; whole runs in s): "
              + "; ".join(f"{m} " + " ".join(f"{t:.3f}" for t in ts) + f" (best {min(ts):.3f}, tokens matching "
                          f"{next(iter(TRICKLE_AB))}'s {100 * tr['token_agreement'][m]:.1f}%, "
                          f"{tr['graphed_prefill_steps'][m]} graphed prefill steps; process CPU s "
                          + " ".join(f"{c:.3f}" for c in tr["cpu_s"][m]) + ", GC s "
                          + " ".join(f"{g['s']:.3f} ({g['collections'][2]} full)" for g in tr["gc"][m]) + ")"
                          for m, ts in tr["totals_s"].items()))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "profile_agentic.json").write_text(json.dumps(
            {"copy_GBps": ceiling, **(prof or {}), "prefill_ab": ab, "trickle_ab": tr}, indent=1))
    w.close()


if __name__ == "__main__":
    main()
