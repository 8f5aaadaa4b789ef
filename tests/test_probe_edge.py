"""The host side of ``benches/gpu/probe_edge.py`` on the CPU: the gap and period it reads from a chain's
``%globaltimer`` marks, held here before a device run reads anything into them."""

from __future__ import annotations

import importlib
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benches" / "gpu"))
probe_edge = importlib.import_module("probe_edge")
sys.path.remove(str(ROOT / "benches" / "gpu"))


def test_edge_stats_reads_first_wait_and_last_end():
    # three launches of two CTAs, ns: launch s's CTAs pass their wait at 10000 s + (0, 300) and end 2000 ns and
    # 2500 ns after; so each gap is 10000 - 2800 = 7200 ns, each period 10000 ns
    marks = np.zeros((3, 2, 2), dtype=np.int64)
    for s in range(3):
        marks[s, 0] = (10000 * s, 10000 * s + 2000)
        marks[s, 1] = (10000 * s + 300, 10000 * s + 2800)
    gap, period = probe_edge.edge_stats(marks)
    assert gap == pytest.approx(7.2)
    assert period == pytest.approx(10.0)


def test_edge_stats_takes_medians_and_allows_overlap():
    # a launch that begins before the one before it ends (the 'none' mode) gives a negative gap
    marks = np.array([[[0, 5000]], [[1000, 6000]], [[9000, 9500]], [[20000, 21000]]], dtype=np.int64)
    gap, period = probe_edge.edge_stats(marks)
    # gaps: 1000 - 5000, 9000 - 6000, 20000 - 9500 -> median 3000 ns; periods 1000, 8000, 11000 -> 8000 ns
    assert gap == pytest.approx(3.0)
    assert period == pytest.approx(8.0)
