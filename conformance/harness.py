"""The harness: building engines for a case, recording repros, the one failure template, the rollout driver
and the token comparisons shared by TURN, ORACLE, MEM and SAMPLE.
"""
# ruff: noqa: B023  (failure messages are lambdas called at once, inside the loop)

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

from reference.config import ModelConfig
from reference.types import SamplingParams, Trajectory, TurnOutput

from . import cases, engines, oracles
from .clauses import CLAUSES
from .tolerance import SHARE_SIGMAS, as_dtype, min_decisive_share, share_floor

# ---------------------------------------------------------------------------------- the failure template

FAILURE_TAG = "CONFORMANCE FAILURE"
MAX_REPRO_LINES = 40


class Repro:
    """Lines of Python that rebuild a case; engine calls are appended as they happen."""

    def __init__(self, lines: list[str] | None = None) -> None:
        self.lines: list[str] = list(lines or [])
        self.setup_len = len(self.lines)

    def add(self, line: str) -> None:
        self.lines.append(line)

    def mark_setup(self) -> None:
        self.setup_len = len(self.lines)

    def render(self, limit: int = MAX_REPRO_LINES) -> tuple[str, str]:
        """``(snippet for the message, full script)``."""
        full = "\n".join(self.lines)
        if len(self.lines) <= limit:
            return full, full
        head = self.lines[:self.setup_len]
        tail = self.lines[self.setup_len:]
        keep = max(8, limit - len(head))
        cut = len(tail) - keep
        return "\n".join(head + [f"# ... {cut} earlier calls: see the full script ..."] + tail[-keep:]), full


def _script_path(clause: str) -> Path:
    test = os.environ.get("PYTEST_CURRENT_TEST", "case").split(" ")[0]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", test)[-150:]
    d = Path(tempfile.gettempdir()) / "turnkv-conformance-repro"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{clause}-{name}.py"


def failure_message(clause: str, what: str, repro: Repro | str | None) -> str:
    c = CLAUSES[clause]
    msg = [f"{FAILURE_TAG} [{clause}] {c.title}", f"  {what}".replace("\n", "\n  ")]
    if repro is not None:
        if isinstance(repro, Repro):
            snippet, full = repro.render()
        else:
            snippet = full = str(repro)
        path = _script_path(clause)
        path.write_text(f"# repro of a [{clause}] conformance failure\n{full}\n")
        msg.append(f"  repro (python; full script: {path}):")
        msg += ["    " + line for line in snippet.splitlines()]
    return "\n".join(msg)


def fail(clause: str, what: str, repro: Repro | str | None = None) -> None:
    """The one failure template: names the clause, says what broke, attaches a repro snippet."""
    __tracebackhide__ = True
    pytest.fail(failure_message(clause, what, repro), pytrace=False)


def check(ok: bool, clause: str, what: str | Callable[[], str], repro: Repro | str | None = None) -> None:
    __tracebackhide__ = True
    if not ok:
        fail(clause, what() if callable(what) else what, repro)


@contextlib.contextmanager
def guard(clause: str, repro: Repro | None) -> Iterator[None]:
    """Unexpected exceptions inside a clause test become failures of that clause, with the repro."""
    __tracebackhide__ = True
    try:
        yield
    except (pytest.fail.Exception, pytest.skip.Exception, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-6:]).rstrip()
        fail(clause, f"unexpected {type(e).__name__}: {e}\n{tb}", repro)


# ---------------------------------------------------------------------------------- engines with a call log

LOGGED = {"rollout_add", "rollout_run_turns", "rollout_continue", "rollout_finish", "generate", "score"}


def fmt(x: Any, names: dict[int, str]) -> str:
    if id(x) in names:
        return names[id(x)]
    if isinstance(x, torch.Tensor):
        return f"torch.tensor({x.tolist()!r}, dtype={x.dtype})"
    return repr(x)


class RecordingEngine:
    """Wraps an engine: public calls go through, each logged into the repro as a line of Python."""

    def __init__(self, eng: Any, repro: Repro, names: dict[int, str], var: str = "eng") -> None:
        object.__setattr__(self, "_eng", eng)
        object.__setattr__(self, "_repro", repro)
        object.__setattr__(self, "_names", names)
        object.__setattr__(self, "_var", var)

    @property
    def inner(self) -> Any:
        return self._eng

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._eng, name)
        if name not in LOGGED or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            parts = [fmt(a, self._names) for a in args] + [f"{k}={fmt(v, self._names)}" for k, v in kwargs.items()]
            line = f"{self._var}.{name}({', '.join(parts)})"
            try:
                out = attr(*args, **kwargs)
            except Exception as e:
                self._repro.add(f"{line}  # raises {type(e).__name__}")
                raise
            if name == "rollout_add":
                line += f"  # -> {out!r}"
            elif name == "rollout_run_turns":
                line = f"out = {line}  # {len(out)} turns"
            elif name == "rollout_finish":
                line = f"traj = {line}"
            elif name == "generate":
                line = f"gen = {line}"
            self._repro.add(line)
            return out

        return call


# ---------------------------------------------------------------------------------- a case


@dataclass
class Case:
    """One model shape under test, with its weights, the engine factory and a repro log."""

    conf: "Conformance"
    model: str
    clause: str
    note: str = ""
    repro: Repro = field(default_factory=Repro)
    names: dict[int, str] = field(default_factory=dict)
    _n_engines: int = 0
    _n_sp: int = 0

    def __post_init__(self) -> None:
        self.cfg: ModelConfig = cases.model_config(self.model)
        self.weights = cases.make_weights(self.model)
        self.repro.lines += [
            "from conformance.repro import *   # torch, SamplingParams, errors, harness helpers",
            f"cfg = model_config({self.model!r}); weights = make_weights(cfg)",
        ]
        if self.note:
            self.repro.add(f"# {self.note}")
        self.repro.mark_setup()

    @property
    def defaults(self) -> dict:
        return cases.engine_defaults(self.model)

    @property
    def block_size(self) -> int:
        return self.defaults["block_size"]

    def engine(self, var: str | None = None, **overrides: Any) -> RecordingEngine:
        kw = {**self.defaults, **self.conf.engine_kwargs, **overrides}
        supports = getattr(self.conf.factory, "supports", None)   # optional: an engine may decline a model shape
        why = supports(self.cfg, **kw) if supports is not None else None
        if why:
            pytest.skip(f"[{self.clause}] {self.conf.spec} declines shape {self.cfg.name}: {why} (a skip, not a pass)")
        var = var or ("eng" if self._n_engines == 0 else f"eng{self._n_engines}")
        self._n_engines += 1
        self.repro.add(f"{var} = build_engine({self.conf.spec!r}, cfg, weights, " +
                       ", ".join(f"{k}={v!r}" for k, v in kw.items()) + ")")
        self.repro.mark_setup()
        with guard(self.clause, self.repro):
            eng = engines.build(self.conf.factory, self.conf.spec, self.cfg, self.weights, **kw)
        return RecordingEngine(eng, self.repro, self.names, var)

    def sp(self, **kw: Any) -> SamplingParams:
        sp = SamplingParams(**kw)
        return self.name_sp(sp)

    def name_sp(self, sp: SamplingParams) -> SamplingParams:
        if id(sp) in self.names:
            return sp
        name = f"sp{self._n_sp}"
        self._n_sp += 1
        self.names[id(sp)] = name
        self.repro.add(f"{name} = {sp!r}")
        return sp

    def noise(self, eng: Any) -> oracles.Noise:
        return oracles.noise(self.model, engines.engine_dtype(eng.inner if isinstance(eng, RecordingEngine) else eng),
                             self.conf.scale.probe_len, self.block_size)

    def fail(self, what: str) -> None:
        __tracebackhide__ = True
        fail(self.clause, what, self.repro)

    def check(self, ok: bool, what: str | Callable[[], str]) -> None:
        __tracebackhide__ = True
        check(ok, self.clause, what, self.repro)

    def clause_fail(self, what: str, repro: Repro | str | None) -> None:
        """Fail this case's clause with a repro of its own (kernel-level cases)."""
        __tracebackhide__ = True
        fail(self.clause, what, repro)

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        __tracebackhide__ = True
        with guard(self.clause, self.repro):
            yield


@dataclass
class Conformance:
    """Session-wide: which engine, at which scale; collects report lines for the terminal summary."""

    spec: str
    factory: Callable[..., Any]
    scale: cases.Scale
    engine_kwargs: dict = field(default_factory=dict)
    report: list[str] = field(default_factory=list)
    engine_device: str = "?"          # where the engine under test runs (its ``device``, from the probe engine)

    def case(self, model: str, clause: str, note: str = "") -> Case:
        why = cases.unavailable(model, oracles.DEVICE, self.engine_device)
        if why:
            pytest.skip(f"[{clause}] shape {model}: {why} (a skip, not a pass)")
        return Case(self, model, clause, note)

    def note(self, line: str) -> None:
        print(line)
        self.report.append(line)


# ---------------------------------------------------------------------------------- the rollout driver


@dataclass
class SeqRun:
    plan: cases.SeqPlan
    sid: int | None = None
    turns: list[TurnOutput] = field(default_factory=list)
    contexts: list[list[int]] = field(default_factory=list)   # context before each turn (harness bookkeeping)
    tokens: list[int] = field(default_factory=list)           # the whole context so far
    sent_obs: list[list[int]] = field(default_factory=list)
    trajectory: Trajectory | None = None
    next_obs: int = 0


def drive(case: Case, eng: Any, wl: cases.Workload, *,
          after_call: Callable[[str, list["SeqRun"], "SeqRun | None"], None] | None = None,
          max_rounds: int = 1000) -> list[SeqRun]:
    """Run a workload through the public interface: add (per ``add_round``), run_turns, continue (unless held),
    finish when the plan is exhausted or the sequence can no longer continue. Checks that every waiting
    sequence comes back with exactly one turn per ``rollout_run_turns``.
    """
    runs = [SeqRun(p) for p in wl.plans]
    for r in runs:
        case.name_sp(r.plan.sp)
    bs = case.block_size
    V = case.cfg.vocab_size
    rnd = 0
    waiting: set[int] = set()
    while any(r.trajectory is None for r in runs):
        if rnd > max_rounds:
            case.fail(f"the workload did not finish in {max_rounds} rounds")
        for r in runs:
            if r.sid is None and r.plan.add_round <= rnd:
                r.sid = eng.rollout_add(r.plan.prompt, r.plan.sp)
                r.tokens = list(r.plan.prompt)
                r.contexts.append(list(r.tokens))
                waiting.add(r.sid)
                if after_call:
                    after_call("add", runs, r)
        outs = eng.rollout_run_turns()
        by_sid = {r.sid: r for r in runs if r.sid is not None}
        unknown = set(outs) - set(by_sid)
        case.check(not unknown, lambda: f"rollout_run_turns returned turns of unknown sequences {sorted(unknown)}")
        lost = waiting - set(outs)
        case.check(not lost, lambda: f"rollout_run_turns lost the turns of waiting sequences {sorted(lost)} "
                                     f"(returned {sorted(outs)}); a waiting sequence must pause or finish")
        extra = set(outs) - waiting
        case.check(not extra, lambda: f"rollout_run_turns returned turns for sequences that were not waiting: {sorted(extra)}")
        waiting = set()
        for sid, out in outs.items():
            r = by_sid[sid]
            r.turns.append(out)
            r.tokens += list(out.token_ids)
        if after_call:
            after_call("run_turns", runs, None)
        rnd += 1
        for r in runs:
            if r.sid is None or r.trajectory is not None or r.sid in waiting:
                continue
            last = r.turns[-1] if r.turns else None
            if last is None:
                continue
            if last.finished or r.next_obs >= len(r.plan.observations):
                r.trajectory = eng.rollout_finish(r.sid)
                if after_call:
                    after_call("finish", runs, r)
                continue
            if rnd in r.plan.hold_rounds:
                continue
            ob = r.plan.observations[r.next_obs]
            if isinstance(ob, cases.BoundaryObs):
                ob = ob.resolve(len(r.tokens), bs, V)
            if len(r.tokens) + len(ob) + 1 > eng.max_model_len:
                r.trajectory = eng.rollout_finish(r.sid)
                if after_call:
                    after_call("finish", runs, r)
                continue
            eng.rollout_continue(r.sid, ob)
            r.next_obs += 1
            r.sent_obs.append(list(ob))
            r.tokens += list(ob)
            r.contexts.append(list(r.tokens))
            waiting.add(r.sid)
            if after_call:
                after_call("continue", runs, r)
    return runs


def expected_stop(context_len: int, tokens: list[int], sp: SamplingParams, max_model_len: int) -> str | None:
    """The stop rule of DESIGN section 2 applied to a finished turn (``None``: the turn should not have ended)."""
    if not tokens:
        return None
    if context_len + len(tokens) >= max_model_len:
        return "context_limit"
    if tokens[-1] in sp.stop_token_ids:
        return "stop_token"
    if len(tokens) >= sp.max_tokens:
        return "max_tokens"
    return None


def early_stop(context_len: int, tokens: list[int], sp: SamplingParams, max_model_len: int) -> int | None:
    """Index of the first token after which the turn should already have ended, if any before the last."""
    for i in range(len(tokens) - 1):
        if expected_stop(context_len, tokens[:i + 1], sp, max_model_len) is not None:
            return i
    return None


def check_bookkeeping(case: Case, eng: Any, runs: list[SeqRun]) -> None:
    """TurnOutputs and Trajectories against the harness's own bookkeeping (exact)."""
    for r in runs:
        sp = r.plan.sp
        t = r.trajectory
        sid = r.sid
        case.check(t is not None, f"sequence {sid} has no trajectory")
        case.check(list(t.token_ids) == r.tokens, lambda: (
            f"sequence {sid}: trajectory.token_ids is not prompt + turns + observations in order\n"
            f"expected {r.tokens}\ngot      {list(t.token_ids)}"))
        case.check(t.num_turns == len(r.turns), f"sequence {sid}: num_turns {t.num_turns}, {len(r.turns)} turns ran")
        case.check(t.prompt_len == len(r.plan.prompt), f"sequence {sid}: prompt_len {t.prompt_len} != {len(r.plan.prompt)}")
        mask = [0] * len(r.plan.prompt)
        lps: list[float] = [0.0] * len(r.plan.prompt)
        spans = [("prompt", 0, len(r.plan.prompt))]
        for k, out in enumerate(r.turns):
            ctx = r.contexts[k]
            toks = list(out.token_ids)
            case.check(out.turn_index == k, f"sequence {sid}: turn {k} reports turn_index {out.turn_index}")
            case.check(1 <= len(toks) <= sp.max_tokens, lambda: (
                f"sequence {sid} turn {k}: {len(toks)} tokens, the per-turn budget is max_tokens={sp.max_tokens}"))
            want = expected_stop(len(ctx), toks, sp, eng.max_model_len)
            case.check(out.stop_reason == want, lambda: (
                f"sequence {sid} turn {k}: stop_reason {out.stop_reason!r}, the stop rule gives {want!r} "
                f"(context {len(ctx)} + {len(toks)} tokens, last {toks[-1]}, max_tokens {sp.max_tokens}, "
                f"max_model_len {eng.max_model_len})"))
            e = early_stop(len(ctx), toks, sp, eng.max_model_len)
            case.check(e is None, lambda: f"sequence {sid} turn {k}: the turn should have ended after token {e}: {toks}")
            case.check(out.finished == (want == "context_limit"), lambda: (
                f"sequence {sid} turn {k}: finished={out.finished} with stop_reason {out.stop_reason!r} "
                f"(an agentic sequence finishes only at the context limit)"))
            case.check(out.context_len in (0, len(ctx)), lambda: (
                f"sequence {sid} turn {k}: context_len {out.context_len}, the context held {len(ctx)} tokens"))
            case.check(isinstance(out.split_kv, str) and bool(out.split_kv), f"sequence {sid} turn {k}: split_kv {out.split_kv!r}")
            if sp.logprobs:
                case.check(out.logprobs is not None and len(out.logprobs) == len(toks), lambda: (
                    f"sequence {sid} turn {k}: logprobs {out.logprobs!r} not aligned with {len(toks)} tokens"))
                case.check(all(lp <= 1e-6 and lp == lp for lp in out.logprobs), lambda: (
                    f"sequence {sid} turn {k}: logprobs must be finite and <= 0: {out.logprobs}"))
            start = len(mask)
            mask += [1] * len(toks)
            lps += list(out.logprobs) if sp.logprobs and out.logprobs is not None else [0.0] * len(toks)
            spans.append(("assistant", start, len(mask)))
            if k < len(r.sent_obs):
                ob = r.sent_obs[k]
                spans.append(("observation", len(mask), len(mask) + len(ob)))
                mask += [0] * len(ob)
                lps += [0.0] * len(ob)
        case.check(list(t.assistant_mask) == mask, lambda: (
            f"sequence {sid}: assistant_mask must be 1 exactly on sampled tokens\n"
            f"expected {mask}\ngot      {list(t.assistant_mask)}"))
        got_spans = [(s.kind, s.start, s.end) for s in t.spans]
        case.check(got_spans == spans, lambda: f"sequence {sid}: spans {got_spans}, expected {spans}")
        if sp.logprobs:
            case.check(t.logprobs is not None and list(t.logprobs) == lps, lambda: (
                f"sequence {sid}: trajectory.logprobs must be the turns' logprobs on assistant tokens and 0.0 elsewhere"))
        case.check(list(t.loss_mask()) == mask[1:] + [0], f"sequence {sid}: loss_mask() must be assistant_mask shifted left by one")
        case.check(t.stop_reason == (r.turns[-1].stop_reason if r.turns else None),
                   f"sequence {sid}: trajectory stop_reason {t.stop_reason!r} != last turn's")


# ---------------------------------------------------------------------------------- token comparisons


@dataclass
class Tally:
    """Steps compared / decisive, for the share requirements."""

    total: int = 0
    compared: int = 0
    excused: int = 0
    decisive: int = 0
    logprob_checked: int = 0
    worst_lp: float = 0.0

    def add(self, other: "Tally") -> None:
        for f in dataclasses.fields(self):
            if f.name == "worst_lp":
                self.worst_lp = max(self.worst_lp, other.worst_lp)
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def share(self, what: str) -> float:
        return getattr(self, what) / self.total if self.total else 0.0


def _decision(case: Case, prefix: list[int], sp: SamplingParams, bound: float) -> oracles.Decision:
    row = oracles.oracle_logits(case.model, prefix)[-1]
    return oracles.decide(row, sp, len(prefix), bound)


def compare_with_regen(case: Case, label: str, context: list[int], cand: list[int], ref: list[int],
                       sp: SamplingParams, bound: float,
                       regen: Callable[[list[int], SamplingParams], list[int]]) -> Tally:
    """``cand`` (e.g. a turn) against ``ref`` (e.g. single-shot ``generate`` of the same context).

    A mismatch is legal only at a non-decisive step of the fp32 oracle (margin within the noise bound);
    the comparison then re-anchors: ``regen(context + cand[:i+1], sp')`` with the remaining budget.
    """
    tally = Tally(total=len(cand))
    base = 0
    while True:
        j = 0
        while base + j < len(cand) and j < len(ref) and cand[base + j] == ref[j]:
            j += 1
        tally.compared += j
        i = base + j
        if i == len(cand) and j == len(ref):
            return tally
        if i < len(cand) and j < len(ref):
            d = _decision(case, context + cand[:i], sp, bound)
            if d.decisive:
                case.fail(f"{label}: step {i} differs: {cand[i]} vs {ref[j]} where the fp32 oracle is decisive "
                          f"(oracle picks {d.token}, margin {d.margin:.4g} > noise bound {bound:.3g})\n"
                          f"candidate {cand}\nreference {ref[:j + 1]} (from step {base})")
            tally.excused += 1
            if i + 1 == len(cand):
                return tally              # the candidate's turn ends here (its own stop rule is checked elsewhere)
            budget = sp.max_tokens - (i + 1)
            if budget < 1:
                case.fail(f"{label}: {len(cand)} tokens exceed max_tokens={sp.max_tokens}")
            ref = regen(context + cand[:i + 1], dataclasses.replace(sp, max_tokens=budget))
            base = i + 1
            continue
        case.fail(f"{label}: same tokens but different lengths: candidate ended after {len(cand)} tokens, reference "
                  f"after {base + len(ref)} (the stop rule differs)\ncandidate {cand}\nreference tail {ref} (from step {base})")


def free_running_tally(case: Case, label: str, context: list[int], cand: list[int], sp: SamplingParams,
                       bound: float, run_oracle: Callable[[list[int], SamplingParams], Any]) -> Tally:
    """``cand`` (the engine's greedy turn) against the free-running no-cache oracle, re-anchored after each legal
    divergence.

    ``run_oracle(context, sp)`` generates one turn by full recompute (``reference.oracle.oracle_generate``: token
    ids, top-1/top-2 margins, stop reason). Every engine step is judged by the oracle run that covers it: equal
    tokens are followed; a different token is legal only where that oracle step is not decisive (margin <= bound),
    and the oracle then starts again from the engine's own context (``context + cand[:i+1]``, with the remaining
    budget), as TURN re-anchors ``generate``. An oracle run that meets no divergence must end where the engine
    ends. ``total`` counts every engine step, ``decisive`` the steps whose oracle margin exceeds the bound (all of
    them checked), ``excused`` the legal divergences (re-anchors).
    """
    tally = Tally(total=len(cand))
    base = 0
    ot = run_oracle(list(context), sp)
    while True:
        ref, margins = list(ot.token_ids), list(ot.margins)
        j = 0
        while base + j < len(cand) and j < len(ref) and cand[base + j] == ref[j]:
            tally.decisive += int(margins[j] > bound)
            j += 1
        tally.compared += j
        i = base + j
        if i == len(cand) and j == len(ref):
            return tally
        if i < len(cand) and j < len(ref):
            if margins[j] > bound:
                case.fail(f"{label}: step {i}: engine {cand[i]} vs free-running oracle {ref[j]} (margin "
                          f"{margins[j]:.4g} > noise bound {bound:.3g}; oracle run from step {base})\n"
                          f"engine {cand}\noracle {ref} (from step {base})")
            tally.excused += 1
            if i + 1 == len(cand):
                return tally              # the engine's turn ends on this token (its stop rule is checked by the caller)
            budget = sp.max_tokens - (i + 1)
            if budget < 1:
                case.fail(f"{label}: {len(cand)} tokens exceed max_tokens={sp.max_tokens}")
            ot = run_oracle(list(context) + cand[:i + 1], dataclasses.replace(sp, max_tokens=budget))
            base = i + 1
            continue
        case.fail(f"{label}: same tokens but different lengths: the engine ended after {len(cand)} tokens, the "
                  f"free-running oracle after {base + len(ref)} ({ot.stop_reason!r}; run from step {base})\n"
                  f"engine {cand}\noracle {ref} (from step {base})")


def oracle_tally(case: Case, label: str, context: list[int], tokens: list[int], logprobs: list[float] | None,
                 sp: SamplingParams, bound: float, *, check_tokens: bool = True,
                 logits: torch.Tensor | None = None) -> Tally:
    """Teacher-forced along the engine's own context: every decisive step must pick the oracle's token, and every
    reported logprob must match the oracle's (within 2 x noise bound; ``processed`` only where the filter is stable).
    ``logits``: the oracle rows predicting ``tokens`` (computed if not given)."""
    tally = Tally(total=len(tokens))
    if not tokens:
        return tally
    if logits is None:
        logits = oracles.oracle_logits(case.model, context + tokens[:-1])[len(context) - 1:]
    for t, tok in enumerate(tokens):
        row = logits[t]
        pos = len(context) + t
        d = oracles.decide(row, sp, pos, bound)
        if d.decisive:
            tally.decisive += 1
            if check_tokens and tok != d.token:
                case.fail(f"{label}: step {t} (position {pos}) picked {tok}, the fp32 no-cache oracle picks {d.token} "
                          f"decisively (margin {d.margin:.4g} > noise bound {bound:.3g})\ntokens {tokens}")
            tally.compared += 1
        if logprobs is not None and (d.decisive or sp.logprobs_mode == "raw" or sp.temperature == 0) \
                and oracles.logprob_stable(row, sp, bound):
            want = oracles.oracle_logprob(row, sp, tok)
            got = float(logprobs[t])
            tol = 2 * bound / (sp.temperature if sp.logprobs_mode == "processed" and sp.temperature > 0 else 1.0)
            err = abs(got - want)
            tally.logprob_checked += 1
            tally.worst_lp = max(tally.worst_lp, err)
            if not err <= tol:
                case.fail(f"{label}: step {t} (position {pos}, token {tok}): logprob {got:.6g}, the oracle's "
                          f"{sp.logprobs_mode} logprob is {want:.6g} (|diff| {err:.3g} > 2 x noise bound {tol:.3g})")
    return tally


def trajectory_oracle_tally(case: Case, label: str, traj: Trajectory, sp: SamplingParams, bound: float,
                            check_tokens: bool = True) -> Tally:
    """``oracle_tally`` over every assistant span of a trajectory, with one oracle forward."""
    ids = list(traj.token_ids)
    logits = oracles.oracle_logits(case.model, ids[:-1]) if len(ids) > 1 else None
    tally = Tally()
    for s in traj.spans:
        if s.kind != "assistant" or s.end <= s.start:
            continue
        lps = traj.logprobs[s.start:s.end] if traj.logprobs is not None else None
        tally.add(oracle_tally(case, f"{label} turn span [{s.start}, {s.end})", ids[:s.start], ids[s.start:s.end],
                               lps, sp, bound, check_tokens=check_tokens, logits=logits[s.start - 1:s.end - 1]))
    return tally


def rollouts_vs_oracle(case: Case, wl: cases.Workload, label: str, describe: Callable[[Any], str]) -> None:
    """Drive ``wl`` on a fresh engine of ``case``, hold every assistant step of every trajectory to the
    no-cache oracle (``trajectory_oracle_tally``: decisive tokens equal, logprobs within 2 x noise bound)
    and require the decisive share of the engine's dtype; ``describe(run)`` names a sequence in messages."""
    eng = case.engine()
    noise = case.noise(eng)
    with case.guard():
        runs = drive(case, eng, wl)
    tally = Tally()
    for r in runs:
        tally.add(trajectory_oracle_tally(case, describe(r), r.trajectory, r.plan.sp, noise.bound))
    require_share(case, tally, "decisive", min_decisive_share(noise.dtype), label)


def require_share(case: Case, tally: Tally, what: str, expected: float, label: str) -> None:
    """The share of ``what`` steps must reach ``share_floor(expected, n)`` (tolerance.SHARE_SIGMAS)."""
    share = tally.share(what)
    floor = share_floor(expected, tally.total)
    case.conf.note(f"[{case.clause}] {case.model}: {label}: {what} {getattr(tally, what)}/{tally.total} steps "
                   f"= {share:.1%} (required >= {floor:.1%}: expected {expected:.0%} less "
                   f"{SHARE_SIGMAS:g} binomial sd); excused {tally.excused}; "
                   f"logprobs checked {tally.logprob_checked}, worst |diff| {tally.worst_lp:.2e}")
    case.check(tally.total > 0 and share >= floor, lambda: (
        f"{label}: only {getattr(tally, what)} of {tally.total} steps ({share:.1%}) were {what}; the clause requires "
        f">= {floor:.1%} (expected {expected:.0%} less {SHARE_SIGMAS:g} binomial standard deviations at "
        f"{tally.total} steps) so that it cannot pass vacuously"))


def dtype_of(eng: Any) -> torch.dtype:
    return engines.engine_dtype(eng.inner if isinstance(eng, RecordingEngine) else eng)


def kernels_of(eng: Any) -> Any:
    return (eng.inner if isinstance(eng, RecordingEngine) else eng).kernels


def to_kernel(t: torch.Tensor, kern: Any, floating: bool = True) -> torch.Tensor:
    dev = getattr(kern, "device", "cpu")
    if floating:
        return t.to(device=dev, dtype=as_dtype(getattr(kern, "dtype", torch.float32)))
    return t.to(device=dev)


class GenerateCache:
    """Single-shot ``generate`` results of one engine, batched per SamplingParams and cached by context."""

    def __init__(self, case: Case, eng: Any) -> None:
        self.case = case
        self.eng = eng
        self.done: dict[tuple, list[int]] = {}

    def prefetch(self, items: list[tuple[list[int], SamplingParams]]) -> None:
        groups: dict[SamplingParams, list[list[int]]] = {}
        for ctx, sp in items:
            if (tuple(ctx), sp) not in self.done:
                groups.setdefault(sp, [])
                if list(ctx) not in groups[sp]:
                    groups[sp].append(list(ctx))
        for sp, ctxs in groups.items():
            self.case.name_sp(sp)
            outs = self.eng.generate(ctxs, sp)
            self.case.check(isinstance(outs, list) and len(outs) == len(ctxs), lambda: (
                f"generate returned {type(outs).__name__} of {len(outs) if hasattr(outs, '__len__') else '?'} "
                f"results for {len(ctxs)} prompts"))
            for c, o in zip(ctxs, outs):
                self.done[(tuple(c), sp)] = [int(t) for t in o]

    def __call__(self, ctx: list[int], sp: SamplingParams) -> list[int]:
        key = (tuple(ctx), sp)
        if key not in self.done:
            self.prefetch([(ctx, sp)])
        return self.done[key]


def turns_vs_generate(case: Case, eng: Any, runs: list[SeqRun], bound: float, gen: GenerateCache | None = None,
                      label: str = "") -> Tally:
    """TURN: every turn of every sequence against single-shot ``generate`` over the context before it."""
    gen = gen or GenerateCache(case, eng)
    items = [(r.contexts[k], r.plan.sp) for r in runs for k in range(len(r.turns))]
    with case.guard():
        gen.prefetch(items)
    tally = Tally()
    for r in runs:
        for k, out in enumerate(r.turns):
            ctx = r.contexts[k]
            with case.guard():
                ref = gen(ctx, r.plan.sp)
            tally.add(compare_with_regen(
                case, f"{label}sequence {r.sid} turn {k} (context {len(ctx)} tokens) vs generate(context)",
                ctx, list(out.token_ids), ref, r.plan.sp, bound, gen))
    return tally
