"""Fixtures of the reference engine's CPU test suite."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))

from _helpers import TINY, tiny_engine, tiny_weights  # noqa: E402
from _standins import launches, opt_engine  # noqa: E402,F401  (fixtures: the optimized engine on stand-in kernels)

# The tiny model's ops are microseconds long: with more than one intra-op thread, OpenMP barriers on a
# loaded 2-core CI machine make each op ~1000x slower (a 0.3 s test took 43 s). One thread is fastest.
torch.set_num_threads(1)

_HC = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large]
# Default: derandomized (the same examples every run: CI never flakes on a fresh random draw).
# HYPOTHESIS_PROFILE=turnkv-explore draws new random examples, 10x as many, for local bug hunting.
settings.register_profile("turnkv", deadline=None, max_examples=10, derandomize=True, print_blob=True,
                          suppress_health_check=_HC)
settings.register_profile("turnkv-explore", deadline=None, max_examples=100, print_blob=True,
                          suppress_health_check=_HC)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "turnkv"))


@pytest.fixture(scope="session")
def tiny_cfg():
    return TINY


@pytest.fixture(scope="session")
def weights():
    """Seeded random weights of the tiny config."""
    return tiny_weights(0)


@pytest.fixture
def make_engine():
    """Factory: ``make_engine(**engine_kwargs)`` -> a tiny reference engine (small pool by default)."""
    return tiny_engine


@pytest.fixture
def engine():
    return tiny_engine()
