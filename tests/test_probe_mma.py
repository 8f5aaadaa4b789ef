"""The host side of ``benches/gpu/probe_mma.py`` on the CPU: the cycles a wgmma, µs and shared-memory bytes a cycle
it reads from a configuration's clock64 counts."""

from __future__ import annotations

import importlib
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benches" / "gpu"))
probe_mma = importlib.import_module("probe_mma")
sys.path.remove(str(ROOT / "benches" / "gpu"))


def test_wgmma_stats():
    # 8 stages of 8 wgmmas at 32 x rows: 64 wgmmas, each reading 2048 + 1024 bytes; median of the counts 3200 cycles
    med, per, us, bpc = probe_mma.wgmma_stats(np.array([3000, 3200, 9000]), 8, 32, 2000.0)
    assert med == 3200
    assert per == pytest.approx(50.0)
    assert us == pytest.approx(1.6)
    assert bpc == pytest.approx(64 * 3072 / 3200)


def test_wgmma_stats_at_64_rows():
    # 6 stages at 64 x rows: 48 wgmmas of 2048 + 2048 bytes
    _, per, _, bpc = probe_mma.wgmma_stats(np.array([960]), 6, 64, 1000.0)
    assert per == pytest.approx(20.0)
    assert bpc == pytest.approx(48 * 4096 / 960)
