#!/usr/bin/env python
"""Run a bench script with the engine's kernels built another way, in the script's own process (the device rounds'
A/B helper, behind ``_env.sh``'s ``profile_with``).

    python benches/gpu/run_with.py [--define NAME ...] [--skinny-wg-source FILE] SCRIPT [ARGS ...]

``--define NAME``: every kernel source compiled with ``-DNAME`` (``optimized.kernels.OPTIONS``), e.g. a build switch
such as ``TK_WG_RELEASE_EXIT``. ``--skinny-wg-source FILE``: ``skinny_wg`` built from FILE's text (with today's
headers, so a header change shows on both sides) and installed as the module the engine launches, e.g. an earlier
commit's ``skinny_wg.cu``. Then SCRIPT runs as ``__main__`` with ARGS as its arguments.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--define", action="append", default=[], metavar="NAME")
    ap.add_argument("--skinny-wg-source", type=Path, default=None, metavar="FILE")
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    sys.path[:0] = [str(ROOT), str(ROOT / "benches" / "gpu")]
    import optimized.kernels as kernels

    kernels.OPTIONS = tuple(kernels.OPTIONS) + tuple(f"-D{d}" for d in a.define)
    if a.skinny_wg_source is not None:
        from ab_attention import build, install

        kernels.load("skinny_wg")   # the plain build first: its target is what the runner asks for
        install(build(a.skinny_wg_source.read_text(), name="skinny_wg"), "skinny_wg")
    sys.argv = [a.script, *a.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(a.script)))
    runpy.run_path(a.script, run_name="__main__")


if __name__ == "__main__":
    main()
