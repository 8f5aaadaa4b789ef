"""The host side of ``benches/gpu/probe_xload.py`` on the CPU: the first, last and slowest figures it reads from a
launch's ``%globaltimer`` marks, and the launch it reports as not all resident."""

from __future__ import annotations

import importlib
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benches" / "gpu"))
probe_xload = importlib.import_module("probe_xload")
sys.path.remove(str(ROOT / "benches" / "gpu"))


def test_xload_stats_cycles_for_a_cta_and_globaltimer_for_the_grid():
    # three CTAs: (meeting, first landed, last landed) in %globaltimer ns, then the same in SM cycles at 2000 MHz
    marks = np.array([[1000, 1500, 3000, 0, 1000, 4000],
                      [1200, 2000, 4200, 500, 2100, 6500],
                      [1100, 1400, 2100, 100, 700, 2100]], dtype=np.int64)
    first, last, slowest = probe_xload.xload_stats(marks, 2000.0)
    # first: 1000, 1600, 600 cycles -> median 1000 = 0.5 µs; last: 4000, 6000, 2000 -> 4000 = 2.0 µs;
    # slowest: %globaltimer 4200 - 1000 ns
    assert first == pytest.approx(0.5)
    assert last == pytest.approx(2.0)
    assert slowest == pytest.approx(3.2)


def test_xload_stats_none_where_a_meeting_timed_out():
    marks = np.array([[1000, 1500, 3000, 0, 1, 2], [0, 2000, 4200, 0, 1, 2]], dtype=np.int64)
    assert probe_xload.xload_stats(marks, 2000.0) is None


def test_clock_stats():
    # a 2^22-cycle spin over 2_097_152 ns: 2000 cycles a µs; the timer's step 256 ns, 300 values seen
    mhz, step, seen = probe_xload.clock_stats(np.array([2_097_152, 1 << 22, 256, 300]))
    assert mhz == pytest.approx(2000.0)
    assert step == pytest.approx(0.256)
    assert seen == 300
