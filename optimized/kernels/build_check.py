"""Compile check of every kernel source with nvcc (no GPU needed).

    python -m optimized.kernels.build_check [--out DIR] [--arch sm_90] [--nvcc PATH]

Compiles each ``optimized/kernels/*.cu`` to a cubin (``<stem>_<arch>.cubin``; a source of ``ARCH_TARGETS``
also for its architecture-specific target, e.g. attention.cu for sm_90a) with ``nvcc -arch=sm_90 --cubin -std=c++17
-ftz=true -Xptxas -v`` (``-ftz=true`` as CuPy's NVRTC compiles them at run time) and prints, per
kernel, the registers, static shared memory, stack frame and spill bytes that ptxas reports (dynamic
shared memory is set at launch: see ``optimized.ops``). Exits non-zero on any compile error, on any
spill beyond a kernel's entry in ``SPILL_ALLOWANCE`` (none: no spill at all), on any advisory of ptxas that it
serialized a kernel's warpgroup MMAs (C7517: a ``wgmma.wait_group`` it injected because registers that a wgmma in
flight defines could be used on some path; C7518: wgmmas on a divergent path), or when a kernel listed
in ``optimized.kernels.SOURCES`` is missing from its cubin. A stack frame without spills is reported
but does not fail the check.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_WGMMA_ADVISORY = re.compile(r"\((C751[78])\).*? in (?:the )?function '([^']+)'")


#: kernel -> (spill store bytes, spill load bytes) it may have, and why. Each entry is a measured trade:
#: the kernel's spills lie outside its hot loop (read in its SASS), and the spill-free arrangement
#: that was tried ran slower on the H200.
SPILL_ALLOWANCE: dict[str, tuple[int, int, str]] = {
    "paged_prefill_d128_x2": (
        16, 64,
        "at 255 registers ptxas keeps a few per-CTA values (among them the reciprocal of the GQA group size) in "
        "local memory: stored once, reloaded in the prologue, once per sequence pass and in the epilogue, never in "
        "the key loop (nvcc 13.0 SASS: 16 B stored, 9 reloads). The spill-free variant measured (the row "
        "tables' skip mask) was 3-5% slower on the H200 (benches/results/h200/ab_variant_*.log; docs/performance.md)",
    ),
    "sample": (
        8, 24,
        "at the 64 registers of a 1024-thread CTA, with -ftz=true (as CuPy compiles it), ptxas stores one value "
        "once after the fourth barrier and reloads it on the way out (nvcc 13.0: 4 B stored, 3 reloads); "
        "without -ftz=true it does not spill. Merging the normaliser's loop into the first one spilled more "
        "(the note at sample's Z1 loop in sampling.cu)",
    ),
}


@dataclass
class KernelInfo:
    name: str
    registers: int = -1
    smem: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0


def parse_ptxas(text: str) -> dict[str, KernelInfo]:
    """Per-kernel resource usage from ``-Xptxas -v`` output."""
    infos: dict[str, KernelInfo] = {}
    current: KernelInfo | None = None
    for line in text.splitlines():
        m = _ENTRY.search(line) or _PROPS.search(line)
        if m:
            name = m.group(1)
            current = infos.setdefault(name, KernelInfo(name))
            continue
        if current is None:
            continue
        m = _FRAME.search(line)
        if m:
            current.stack, current.spill_stores, current.spill_loads = map(int, m.groups())
        m = _USED.search(line)
        if m:
            current.registers = int(m.group(1))
            s = _SMEM.search(line)
            current.smem = int(s.group(1)) if s else 0
    return infos


def wgmma_advisories(text: str) -> list[tuple[str, str]]:
    """(code, kernel) of each advisory in ``-Xptxas -v`` output that ptxas serialized a kernel's wgmmas: C7517, a
    warpgroup wait it injected (skinny_wg.cu's stage loop had one at its back edge until the sixty-second session,
    so no stage's wgmmas overlapped the next's), and C7518, wgmmas on a divergent path."""
    return [(m.group(1), m.group(2)) for m in map(_WGMMA_ADVISORY.search, text.splitlines()) if m]


def compile_one(nvcc: str, src: Path, out_dir: Path, arch: str) -> tuple[int, str]:
    cmd = [nvcc, f"-arch={arch}", "--cubin", "-std=c++17", "-ftz=true", "-Xptxas", "-v", "-o",
           str(out_dir / f"{src.stem}_{arch}.cubin"), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def _inventory() -> dict:
    """``SOURCES`` of ``optimized/kernels/__init__.py``, read without importing the ``optimized`` package
    (which needs torch): the compile check needs only nvcc."""
    return _kernels_module().SOURCES


def _arch_targets() -> dict:
    """``ARCH_TARGETS`` of ``optimized/kernels/__init__.py`` (read as ``_inventory`` reads SOURCES)."""
    return _kernels_module().ARCH_TARGETS


def _kernels_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("_turnkv_kernel_inventory", Path(__file__).with_name("__init__.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="folder for the cubins (default: a temporary folder)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "nvcc")
    args = ap.parse_args(argv)

    SOURCES = _inventory()  # the kernel inventory

    if shutil.which(args.nvcc) is None and not Path(args.nvcc).exists():
        print(f"build_check: nvcc not found ({args.nvcc})", file=sys.stderr)
        return 2
    tmp = None
    if args.out is None:
        tmp = tempfile.TemporaryDirectory()
        out_dir = Path(tmp.name)
    else:
        out_dir = args.out
        out_dir.mkdir(parents=True, exist_ok=True)

    failures: list[str] = []
    rows: list[tuple[str, KernelInfo]] = []
    sources = sorted(KERNEL_DIR.glob("*.cu"))
    unknown = sorted({s.stem for s in sources} - set(SOURCES))
    missing_src = sorted(set(SOURCES) - {s.stem for s in sources})
    failures += [f"{n}.cu is not listed in optimized.kernels.SOURCES" for n in unknown]
    failures += [f"{n}.cu is listed in SOURCES but missing" for n in missing_src]
    # the architecture-specific builds of --arch's compute capability (attention.cu for sm_90a at sm_90)
    digits = args.arch.removeprefix("sm_")
    cap = (int(digits[:-1]), int(digits[-1])) if digits.isdigit() else None
    builds = [(src, args.arch) for src in sources]
    builds += [(src, target) for src in sources for (name, c), target in sorted(_arch_targets().items())
               if name == src.stem and c == cap]
    for src, arch in builds:
        rc, log = compile_one(args.nvcc, src, out_dir, arch)
        warnings = [ln for ln in log.splitlines() if "warning" in ln.lower()]
        if rc != 0:
            failures.append(f"{src.name} ({arch}): nvcc exited with {rc}")
            print(log)
            continue
        for w in warnings:
            print(f"  {src.name}: {w.strip()}")
        infos = parse_ptxas(log)
        failures += [f"{src.name}:{kname} ({arch}): ptxas serialized its wgmmas (advisory {code})"
                     for code, kname in sorted(set(wgmma_advisories(log)))]
        for kname in SOURCES.get(src.stem, ()):
            if kname not in infos:
                failures.append(f"{src.name}: kernel {kname} not found in the cubin")
        for info in infos.values():
            rows.append((src.name if arch == args.arch else f"{src.name}:{arch}", info))
            st_ok, ld_ok, _ = SPILL_ALLOWANCE.get(info.name, (0, 0, ""))
            if info.spill_stores > st_ok or info.spill_loads > ld_ok:
                failures.append(f"{src.name}:{info.name} spills ({info.spill_stores} B stores, {info.spill_loads} B loads;"
                                f" allowed {st_ok} / {ld_ok})")

    print(f"{'file':<16} {'kernel':<26} {'regs':>5} {'smem(B)':>8} {'stack(B)':>9} {'spill st/ld':>12}")
    for fname, info in rows:
        note = "  <- stack frame" if info.stack and not (info.spill_stores or info.spill_loads) else ""
        if (info.spill_stores or info.spill_loads) and info.name in SPILL_ALLOWANCE:
            note = "  <- allowed: SPILL_ALLOWANCE"
        print(f"{fname:<16} {info.name:<26} {info.registers:>5} {info.smem:>8} {info.stack:>9} "
              f"{info.spill_stores:>5}/{info.spill_loads:<6}{note}")
    print("(smem = static shared memory; attention kernels add dynamic shared memory at launch: "
          "paged_prefill (4*BN [+ BM for _x2])*(D+8)*2 B, split_kv_partials (16+256)*(D+8)*2 B)")
    if tmp is not None:
        tmp.cleanup()
    if failures:
        print("\nFAILED:")
        for f in failures:
            print(f"  {f}")
        return 1
    extra = "".join(f" + {src.name} for {arch}" for src, arch in builds if arch != args.arch)
    print(f"\nOK: {len(sources)} sources, {len(rows)} kernels, arch {args.arch}{extra}, no spills beyond SPILL_ALLOWANCE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
