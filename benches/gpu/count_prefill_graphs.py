"""Run pytest with the optimized runner's prefill graphs switched on (``--prefill-graph-tokens N``: every
``CudaRunner`` on graphs gets ``prefill_graph_max_tokens = N``; 0 leaves the default, on since the forty-sixth
session) and a count of the prefill steps replayed from them, so that a conformance run shows it went through them
(the suite does not know the runner's switches). Its own option comes first; the rest go to pytest:

    python3 benches/gpu/count_prefill_graphs.py --prefill-graph-tokens 256 conformance -q --engine optimized ...

Prints ``prefill graphs: S steps over C captured keys (per token bucket: ...)`` after pytest's own summary and
exits with pytest's status."""
from __future__ import annotations

import collections
import sys

import pytest

import optimized.runner as orun

steps: collections.Counter[int] = collections.Counter()     # token bucket -> prefill steps replayed through it
captures: list[tuple[int, int, int]] = []                   # the keys captured: (token, row, context bucket)


def _switched_on(init, tokens: int):
    def init_on(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if self.use_graphs:
            self.prefill_graph_max_tokens = tokens
    return init_on


def _counted_run(run):
    def counted(self, batch):
        steps[self.prefill_graph_key(batch)[0]] += 1
        known = set(self.prefill_graphs)
        out = run(self, batch)
        captures.extend(k for k in self.prefill_graphs if k not in known)     # a step captures its key at first use
        return out
    return counted


def install(tokens: int) -> None:
    """Patch ``CudaRunner`` (and so its subclasses): the switch (``tokens`` > 0) and the counts."""
    if tokens > 0:
        orun.CudaRunner.__init__ = _switched_on(orun.CudaRunner.__init__, tokens)
    orun.CudaRunner._run_prefill_graph = _counted_run(orun.CudaRunner._run_prefill_graph)


def summary() -> str:
    per = ", ".join(f"{n}: {steps[n]}" for n in sorted(steps)) or "none"
    return f"prefill graphs: {sum(steps.values())} steps over {len(captures)} captured keys (per token bucket: {per})"


def main(argv: list[str]) -> int:
    tokens = 0
    if argv[:1] == ["--prefill-graph-tokens"]:
        if len(argv) < 2 or not argv[1].isdigit():
            sys.exit("count_prefill_graphs.py: --prefill-graph-tokens needs a count of tokens >= 0")
        tokens, argv = int(argv[1]), argv[2:]
    install(tokens)
    rc = pytest.main(argv)
    print(summary(), flush=True)
    return int(rc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
