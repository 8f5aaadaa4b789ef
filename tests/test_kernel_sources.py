"""The kernel inventory without a GPU: sources with their local headers pasted in (what NVRTC and
CuPy's disk cache see), and the names and constants ``optimized/ops.py`` launches by agreeing with
``optimized/kernels``. (``nox -s kernels`` compiles every source with nvcc; the GPU checks run the kernels.)"""

from __future__ import annotations

import re

import pytest

from optimized import kernels, ops


def test_local_headers_are_pasted_once():
    for name in kernels.SOURCES:
        text = kernels.source(name)
        assert not re.search(r'^\s*#include "', text, re.MULTILINE), f"{name}.cu: a local include survived"
    gemm, attn = kernels.source("gemm"), kernels.source("attention")
    header = (kernels.KERNEL_DIR / "mma.cuh").read_text()
    for text in (gemm, attn):
        assert text.count("void mma_bf16(") == 1 and text.count("void cp_async16(") == 1
    assert "mma_bf16" in header and "mma_bf16" not in (kernels.KERNEL_DIR / "gemm.cu").read_text().split("namespace {")[0]
    with pytest.raises(KeyError):
        kernels.source("no_such_kernel")


def test_ops_launch_only_inventoried_kernels():
    gemm_names = set(kernels.SOURCES["gemm"])
    for tile in ops.GEMM_TILES:
        assert {f"gemm_{tile}_bf16", f"gemm_{tile}_f32"} <= gemm_names, tile
    for tile, (rows, stages, cps, _) in ops.GEMM_STAGED.items():
        assert {f"gemm_staged_m{rows}_s{stages}c{cps}_{out}" for out in ("bf16", "f32")} <= gemm_names, tile
    for tile in ops.GEMM_WIDE:
        assert {f"gemm_{tile}_{out}" for out in ("bf16", "f32", "swiglu")} <= gemm_names, tile
    attn = set(kernels.SOURCES["attention"])
    for D in ops.ATTN_HEAD_DIMS:
        assert f"split_kv_partials_d{D}" in attn
        assert {name for name, *_ in ops.PREFILL_VARIANTS[D].values()} <= attn


def test_gemm_chunk_and_shared_memory_agree_with_the_source():
    src = (kernels.KERNEL_DIR / "gemm.cu").read_text()
    assert int(re.search(r"constexpr int KC = (\d+);", src).group(1)) == ops.GEMM_CHUNK
    for name, (bm, bn, warps, bk, stages, split) in ops.GEMM_TILES.items():
        tag = name.removeprefix("split_")
        macro = "TK_GEMM_SPLIT2" if split else "TK_GEMM2"
        m = re.search(rf"{macro}\({tag}, (\d+), (\d+), (\d+), (\d+), (\d+), (\d+)\)", src)
        assert m, f"{name}: no {macro} instantiation"
        BM, BN, WM, WN, BK, ST = map(int, m.groups())
        assert (BM, BN, WM * WN, BK, ST) == (bm, bn, warps, bk, stages), name
        assert ops.GEMM_CHUNK % bk == 0
        assert stages * (bm + bn) * (bk + 8) * 2 <= 227 * 1024, f"{name}: too much shared memory"


def test_skinny_warps_rule_and_its_kernels():
    """``skinny_warps``: 4 warps from ``SKINNY_W4_TILES`` tiles of 16 rows on (8B gate/up, the LM heads),
    16 for few CTAs over a long K, 8 otherwise (8B qkv, o_proj, down) -- and every pick has a kernel."""
    assert ops.skinny_warps(24576, 4096) == 4 and ops.skinny_warps(151936, 1024) == 4
    assert ops.skinny_warps(6144, 4096) == 8 and ops.skinny_warps(4096, 4096) == 8
    assert ops.skinny_warps(4096, 12288) == 8                    # 256 tiles x 8 warps = 2048: not short
    assert ops.skinny_warps(1024, 4096) == 16                    # 64 tiles, 128 k-blocks
    assert ops.skinny_warps(16 * (ops.SKINNY_W4_TILES - 1), 4096) == 8
    names = set(kernels.SOURCES["skinny_gemm"])
    for N, K in ((24576, 4096), (6144, 4096), (1024, 4096), (64, 64)):
        w = ops.skinny_warps(N, K)
        for m in (8, 16):
            assert {f"skinny_m{m}_w{w}_bf16", f"skinny_m{m}_w{w}_f32", f"skinny_swiglu_m{m}_w{w}"} <= names, (N, K, w)


def test_sampling_constants_agree_with_the_source():
    """``ops.sample`` sizes the partials buffer and the two grids from sampling.cu's constants."""
    src = (kernels.KERNEL_DIR / "sampling.cu").read_text()

    def const(name: str) -> int:
        return int(re.search(rf"constexpr int {name} = (\d+);", src).group(1))

    assert const("PART_THREADS") == ops.SAMPLE_PARTIAL_THREADS
    assert const("SLOTS") == ops.SAMPLE_SLOTS and const("TOPK_CAP") == ops.SAMPLE_TOPK_CAP
    assert re.search(r"struct Cand \{\s*float x;\s*int i;\s*\};", src), "Cand is two 4-byte words (ops: [..., 2] fp32)"
    assert const("PART_THREADS") * const("PER_THREAD") == ops.SAMPLE_CHUNK
    fields = re.search(r"struct Partial \{(.*?)\};", src, re.S).group(1)
    words = sum(int(n) if n else 1 for n in re.findall(r"^\s*(?:float|int) \w+(?:\[(\d+)\])?;", fields, re.M))
    assert words == ops.SAMPLE_PARTIAL_WORDS == 8
    assert {"sample", "sample_partial"} <= set(kernels.SOURCES["sampling"])
    assert ops.sample_chunks(151936) == 38 and ops.sample_chunks(4096) == 1 and ops.sample_chunks(7) == 1
    assert ops.SAMPLE_MAX_V // ops.SAMPLE_CHUNK * ops.SAMPLE_CHUNK + 4 * ops.SAMPLE_CHUNK < 2**31


def test_gemm_choice_is_a_speed_choice_only():
    """The rule measured on the H200 (docs/performance/batch_invariant.md, "The wide kernel of the batch-invariant GEMM"): the wide
    kernel for up to 128 rows with K a multiple of 64 (for up to 16 rows only with N >= 4096), its build by rows
    and N; the staged kernel for up to 8 rows over K > 1024 and for up to 16 / 32 rows of small weights; split
    (K-parallel) tiles for the other decode steps with at least two chunks and a small workspace; folding tiles
    otherwise. Every choice is a built kernel that takes M rows."""
    assert ops.gemm_choice(1, 4096, 4096) == ops.gemm_choice(16, 151936, 1024) == "wide_m16_n64_k256s4"
    assert ops.gemm_choice(1, 1024, 2048) == ops.gemm_choice(8, 1024, 3072) == "staged_m8_s4c2"   # N < 4096
    assert ops.gemm_choice(1, 4104, 4104) == "staged_m8_s4c2"                                    # K % 64 != 0
    assert ops.gemm_choice(1, 4096, 4096, tensor_maps=False) == "staged_m8_s4c2"                 # no driver path
    assert ops.gemm_choice(32, 4096, 4096, tensor_maps=False) == "split_64x64"
    assert ops.gemm_choice(9, 1024, 3072) == ops.gemm_choice(16, 1024, 2048) == "staged_m16_s3c2"
    assert ops.gemm_choice(9, 4096, 4104) == "split_16x64"
    assert ops.gemm_choice(16, 151936, 4104) == "16x32"           # the LM head: the workspace would be too big
    assert ops.gemm_choice(17, 1024, 1024) == ops.gemm_choice(32, 6144, 4096) == "wide_m32_n32_k256s3"
    assert ops.gemm_choice(32, 24576, 4096) == ops.gemm_choice(24, 151936, 1024) == "wide_m32_n64_k256s4"
    assert ops.gemm_choice(32, 6152, 1032) == "staged_m32_s2c1x2"  # K % 64 != 0, small weights
    assert ops.gemm_choice(33, 4096, 12288) == ops.gemm_choice(64, 1024, 3072) == "wide_m64_n32_k256s2w8"
    assert ops.gemm_choice(64, 6144, 4096) == ops.gemm_choice(64, 151936, 4096) == "wide_m64_n64_k256s3w8"
    assert ops.gemm_choice(65, 4096, 4096) == ops.gemm_choice(128, 1024, 3072) == "wide_m128_n32_k256s2w8"
    assert ops.gemm_choice(65, 6144, 1024) == ops.gemm_choice(96, 151936, 4096) == "wide_m128_n64_k128s4w16"
    assert ops.gemm_choice(97, 24576, 4096) == ops.gemm_choice(128, 151936, 4096) == "wide_m128_n64_k128s4w8"
    assert ops.gemm_choice(32, 4096, 4104) == ops.gemm_choice(64, 4096, 12296) == "split_64x64"
    assert ops.gemm_choice(33, 4096, 456) == "64x64"              # one chunk: nothing to split
    assert ops.gemm_choice(64, 151936, 4104) == "64x64"           # the workspace would be too big
    assert ops.gemm_choice(200, 4096, 4096) == "64x64"
    assert ops.gemm_choice(4096, 4096, 4096) == "128x64"
    for M in (1, 2, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 300):
        for N in (64, 1024, 4096, 6144, 151936):
            for K in (48, 1024, 1032, 4096):
                tile = ops.gemm_choice(M, N, K)
                assert ops.gemm_choice(M, N, K, tensor_maps=False) not in ops.GEMM_WIDE
                assert (tile in ops.GEMM_TILES or (tile in ops.GEMM_STAGED and M <= ops.GEMM_STAGED[tile][0])
                        or (tile in ops.GEMM_WIDE and M <= ops.GEMM_WIDE[tile][0] and K % 64 == 0)), (M, N, K, tile)


def test_gemm_wide_kernels_match_their_instantiations():
    """Every ``GEMM_WIDE`` entry is instantiated with its rows, tile, columns a stage, stages and consumer warps
    (``TK_GEMM_WIDE`` four, ``TK_GEMM_WIDE_W8`` eight, ``TK_GEMM_WIDE_W16`` sixteen), and its name says so; its warp
    grid gives each warp whole pairs of n8 tiles (the static_assert of gemm.cu, by the same formula), and its shared
    memory fits."""
    src = (kernels.KERNEL_DIR / "gemm.cu").read_text()
    built = {(*map(int, m[1:]), int(m[0][2:]) if m[0] else 4)
             for m in re.findall(r"^TK_GEMM_WIDE(_W8|_W16)?\((\d+), (\d+), (\d+), (\d+)\)", src, re.M)}
    assert built == set(ops.GEMM_WIDE.values())
    assert "WM = R / 16 < CW / 2 ? R / 16 : CW / 2, WN = CW / WM;" in src
    for name, (rows, tw, ks, stages, warps) in ops.GEMM_WIDE.items():
        assert name == f"wide_m{rows}_n{tw}_k{ks}s{stages}" + (f"w{warps}" if warps > 4 else ""), name
        wm = min(rows // 16, warps // 2)
        nt = tw // 8 // (warps // wm)
        assert rows // 16 // wm >= 1 and nt >= 2 and nt % 2 == 0 and ops.GEMM_CHUNK % ks == 0 and ks % 64 == 0, name
        smem = ops.gemm_wide_smem(rows, tw, ks, stages)
        assert smem == 1024 + stages * (tw + rows) * ks * 2 and smem <= 227 * 1024, name


def test_gemm_staged_kernels_match_their_instantiations():
    """Every ``GEMM_STAGED`` entry is instantiated with its rows, stages and chunks a stage, and its name says so;
    the launch's threads, the row pitch and the shared memory that ops.py derives are the kernel's, and fit (two
    CTAs where ops asks for room for two)."""
    src = (kernels.KERNEL_DIR / "gemm.cu").read_text()
    cw = int(re.search(r"constexpr int kGsCW = (\d+);", src).group(1))
    assert ops._GEMM_STAGED_THREADS == 32 * (cw + 1)
    assert "constexpr int gs_rs(int cps) { return cps * KC * 2 + 16; }" in src
    assert ops.gemm_staged_smem(8, 1, 2) == 24 * (4 * ops.GEMM_CHUNK + 16)
    built = {tuple(map(int, m)) for m in re.findall(r"^TK_GEMM_STAGED\((\d+), (\d+), (\d+)\)", src, re.M)}
    assert built == {(rows, stages, cps) for rows, stages, cps, _ in ops.GEMM_STAGED.values()}
    for name, (rows, stages, cps, per_sm) in ops.GEMM_STAGED.items():
        assert name == f"staged_m{rows}_s{stages}c{cps}" + ("x2" if per_sm == 2 else ""), name
        assert rows in (8, 16, 32) and stages >= 2 and cps in (1, 2, 4) and per_sm in (1, 2), name
        smem = ops.gemm_staged_smem(rows, stages, cps)
        assert smem <= 227 * 1024, name
        assert per_sm == 1 or smem <= ops.GEMM_STAGED_TWO_CTAS, name
    assert 2 * (ops.GEMM_STAGED_TWO_CTAS + 3 * 1024) <= 228 * 1024


def test_prefill_variants_match_their_instantiations():
    """Every paged-prefill variant's (head dim, keys per tile, rows per CTA, tiles per warp) is the
    one attention.cu instantiates under that name, so the launch geometry and shared memory that
    ops.py derives from the table are the kernel's."""
    src = (kernels.KERNEL_DIR / "attention.cu").read_text()
    inst = {m[0]: tuple(int(x) for x in m[1:5])
            for m in re.findall(r"^TK_PREFILL\((\w+), (\d+), (\d+), (\d+), (\d+), \d+\)", src, re.M)}
    # the wgmma kernels: head dim 128, 64 keys a tile, one 16-row tile per warp (TK_PREFILL_WG's body)
    assert "paged_prefill_impl<128, 64, BMV, 1, true>(" in src
    inst |= {m[0]: (128, 64, int(m[1]), 1) for m in re.findall(r"^TK_PREFILL_WG\((\w+), (\d+), \d+\)", src, re.M)}
    # the warp-specialised kernel: the same tiles, 128 rows (two consumer warpgroups of 64)
    assert "paged_prefill_ws_impl<128, 64>(" in src and "BM = 128, NS = WS_STAGES" in src
    inst["paged_prefill_d128_ws"] = (128, 64, 128, 1)
    for D, variants in ops.PREFILL_VARIANTS.items():
        for name, bn, bm, mt in variants.values():
            assert inst[name] == (D, bn, bm, mt), name
    assert set(ops.PREFILL_WGMMA) == {v for v, (name, *_) in ops.PREFILL_VARIANTS[128].items()
                                      if "_wg" in name or "_ws" in name}
    # the ring of the warp-specialised kernel is attention.cu's WS_STAGES, and its shared memory fits one CTA
    assert set(ops.PREFILL_WS_STAGES) <= set(ops.PREFILL_WGMMA)
    assert f"WS_STAGES = {ops.PREFILL_WS_STAGES['ws']}," in src
    assert ops.prefill_smem_bytes(128, 64, 128, 1, swizzled=True, ring=4) == 166912
    assert "166912" in src
    assert 166912 + 7744 + 1024 <= 228 * 1024                  # + its static shared memory (ptxas)
    assert ops.prefill_smem_bytes(128, 64, 64, 1) == 69632      # Q aliased onto a stage
    assert ops.prefill_smem_bytes(128, 64, 128, 2) == 104448    # Q in its own buffer
    # wgmma: (2 K + 3 or 4 V tiles) x 16 KB + Q's padded rows + 1 KB of alignment slack, as PrefillCfg says
    assert ops.prefill_smem_bytes(128, 64, 64, 1, swizzled=True) == 100352
    assert ops.prefill_smem_bytes(128, 64, 128, 1, swizzled=True) == 134144
    for size in (100352, 134144):
        assert str(size) in src, size
    assert 2 * (100352 + 3328 + 1024) <= 228 * 1024               # wg64: two CTAs a multiprocessor


def test_prefill_variant_choice():
    sms = 132
    assert ops.prefill_variant(8192, 32, 8, 128, sms) == "x2"       # 256 CTAs of 128 rows x 8 heads
    assert ops.prefill_variant(256, 32, 8, 128, sms) == "default"   # 8 x 8 = 64 CTAs: keep 64-row CTAs
    assert ops.prefill_variant(8192, 16, 8, 64, sms) == "x2"
    assert ops.prefill_variant(8192, 4, 4, 32, sms) == "default"    # no two-tile kernel for D = 32
    # the boundary: the x2 grid must give every multiprocessor two CTAs
    t_edge = 2 * sms * (128 // 4) // 8
    assert ops.prefill_variant(t_edge, 32, 8, 128, sms) == "x2"
    assert ops.prefill_variant(t_edge - 128 // 4, 32, 8, 128, sms) == "default"


def test_prefill_variant_never_picks_the_wgmma_kernels():
    """wg64 and wg128 are a caller's choice (``variant=``): the H200 gave them no speed over the mma.sync
    kernels. The warp-specialised ``ws`` takes x2's place on x2's grids where the build has it, unless the
    caller's mean keys a row sees is below ``WS_MIN_MEAN_KEYS`` (short fresh chunks)."""
    sms = 132
    for T in (64, 256, 8192, 65536):
        assert ops.prefill_variant(T, 32, 8, 128, sms) not in ops.PREFILL_WGMMA
        for keys in (None, 1.0, 300.0, 1e5):
            choice = ops.prefill_variant(T, 32, 8, 128, sms, ws=True, mean_keys=keys)
            assert choice not in ("wg64", "wg128")
            x2 = ops.prefill_variant(T, 32, 8, 128, sms)
            short = keys is not None and keys < ops.WS_MIN_MEAN_KEYS
            assert choice == ("ws" if x2 == "x2" and not short else x2), (T, keys, choice)
    assert ops.prefill_variant(8192, 16, 8, 64, sms, ws=True) == "x2"   # no ws kernel at head dim 64


def test_arch_specific_build_targets(monkeypatch):
    """attention.cu and skinny_wg.cu are built for sm_90a on a compute-capability-9.0 device (their wgmma
    kernels), every other source and every other device as CuPy builds it; ``TURNKV_ARCH_SPECIFIC=0`` turns that
    off."""
    monkeypatch.delenv("TURNKV_ARCH_SPECIFIC", raising=False)
    wgmma = ("attention", "skinny_wg")
    for name in wgmma:
        assert kernels.arch_target(name, (9, 0)) == "sm_90a"
        assert kernels.arch_target(name, (8, 0)) is None and kernels.arch_target(name, (10, 0)) is None
    assert all(kernels.arch_target(name, (9, 0)) is None for name in kernels.SOURCES if name not in wgmma)
    monkeypatch.setenv("TURNKV_ARCH_SPECIFIC", "0")
    assert all(kernels.arch_target(name, (9, 0)) is None for name in wgmma)


def test_nvrtc_target_swaps_cupys_architecture_flag_for_one_compile(monkeypatch):
    """``_nvrtc_target`` replaces the helper CuPy takes ``-arch=sm_XY`` (and its disk-cache key) from, and
    puts it back afterwards, also when the compile raises."""
    import sys
    import types

    def original(arch=None):
        return ("-arch=sm_90", "cubin")

    compiler = types.SimpleNamespace(_get_arch_for_options_for_nvrtc=original)
    cuda = types.SimpleNamespace(compiler=compiler)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.compiler", compiler)
    with kernels._nvrtc_target("sm_90a"):
        assert compiler._get_arch_for_options_for_nvrtc() == ("-arch=sm_90a", "cubin")
        assert compiler._get_arch_for_options_for_nvrtc("90") == ("-arch=sm_90a", "cubin")
    assert compiler._get_arch_for_options_for_nvrtc is original
    with pytest.raises(RuntimeError):
        with kernels._nvrtc_target("sm_90a"):
            raise RuntimeError("NVRTC failed")
    assert compiler._get_arch_for_options_for_nvrtc is original


def test_wgmma_kernels_are_guarded_by_the_sm90a_feature_macro():
    """The wgmma instructions exist only under ``__CUDA_ARCH_FEAT_SM90_ALL`` (an sm_90a build); elsewhere
    the kernels keep their names and signatures and trap."""
    header = (kernels.KERNEL_DIR / "mma.cuh").read_text()
    guarded = header[header.index("#if defined(__CUDA_ARCH_FEAT_SM90_ALL)"):header.index("#endif  // __CUDA_ARCH_FEAT_SM90_ALL")]
    assert header.count("\"wgmma.") == guarded.count("\"wgmma.") > 0   # every wgmma instruction string
    src = (kernels.KERNEL_DIR / "attention.cu").read_text()
    body = src[src.index("#ifdef TK_WGMMA\n#define TK_PREFILL_WG_BODY"):src.index("#define TK_PREFILL_WG(")]
    assert body.index("paged_prefill_impl<") < body.index("#else") < body.index("__trap();") < body.index("#endif")


def _kernel_entries(text: str) -> list[tuple[str, list[str]]]:
    """(signature head, first statements of the body) of every ``extern "C" __global__`` definition,
    macro continuations and comments removed."""
    text = re.sub(r"\\\n", "\n", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    out = []
    for m in re.finditer(r'extern "C" __global__', text):
        brace = text.index("{", m.end())
        body = text[brace + 1:brace + 400]
        stmts = [s.strip() for s in body.split(";")[:3]]
        head = re.sub(r"__launch_bounds__\([^)]*\)", "", text[m.end():brace])
        out.append((head.split("(")[0].split()[-1], stmts))
    return out


def _kernel_body(text: str, name: str) -> str:
    """The body of ``extern "C" __global__`` kernel ``name`` (between its braces), comments removed."""
    text = re.sub(r"//[^\n]*", "", text)
    start = text.index("{", re.search(rf'extern "C" __global__[^{{;]*?\b{name}\(', text).end())
    depth, i = 0, start
    while True:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1:i]
        i += 1


def test_every_kernel_waits_for_its_predecessor_first():
    """Programmatic dependent launch (optimized/launch.py) lets a kernel start before the previous one
    ends; pdl.cuh's griddepcontrol.wait is what keeps the order. So the first statement of every kernel
    is ``pdl_entry()`` -- except skinny_gemm's, which first prefetches its weights (written by no kernel)
    into L2 when its ``prefetch`` argument asks, and then waits, and its staged kernels, whose producer
    may copy the first ``pre`` stages of weights before its wait and whose consumers wait before anything
    else (so do the warpgroup kernel's, the cluster kernel's and gemm.cu's wide kernel's), and qk_norm_rope,
    which may let the next launch be scheduled first (``trigger_first``) -- and nothing of a kernel touches
    global memory before it."""
    header = (kernels.KERNEL_DIR / "pdl.cuh").read_text()
    assert "griddepcontrol.wait" in header and "griddepcontrol.launch_dependents" in header
    seen = 0
    for name in kernels.SOURCES:
        text = kernels.source(name)
        assert text.count("void pdl_entry()") == 1, f"{name}.cu: pdl.cuh not pasted exactly once"
        entries = _kernel_entries(text)
        assert entries, name
        for kname, stmts in entries:
            seen += 1
            if kname.startswith("skinny_staged"):
                assert stmts[0].startswith("skinny_staged_impl<"), (kname, stmts)
            elif kname.startswith("skinny_cluster"):
                assert stmts[0].startswith("skinny_cluster_impl<"), (kname, stmts)
            elif name == "skinny_wg":
                assert stmts[0].startswith("skinny_wg_impl<"), (kname, stmts)
            elif kname.startswith("gemm_wide"):
                assert stmts[0].startswith("gemm_wide_impl<"), (kname, stmts)
            elif kname.startswith("split_kv_qk_partials"):
                assert stmts[0].startswith("split_kv_partials_impl<DV, true>("), (kname, stmts)
            elif kname == "kv_prefetch":     # it triggers first and waits last (kv_cache.cu)
                assert stmts[0] == "pdl_launch_dependents()", stmts
                body = _kernel_body(text, kname)
                assert body.rstrip().endswith("pdl_wait();"), body
                # (the line-prefetch branch waits and returns before the bulk loop)
                assert body.count("pdl_wait()") == 2 and "pdl_wait();\n    return;\n  }" in body, body
                # it writes no memory: no store through an index or a pointer, and its only asm is the L2 prefetches
                assert not re.search(r"\]\s*=[^=]|\*\s*\w+\s*=[^=]", body), body
                asm = set(re.findall(r'asm volatile\("([\w.]+)', body))
                assert asm == {"cp.async.bulk.prefetch.L2.global", "prefetch.global.L2"}, body
            elif kname == "qk_norm_rope":    # it may let the next launch start first (ops.qk_norm_rope's trigger_first)
                assert stmts[:2] == ["if (trigger_first) pdl_launch_dependents()", "pdl_entry()"], stmts
            elif kname == "NAME##_d##DV":     # attention.cu's split_kv_partials and its early twin (TK_SPLITKV_K)
                assert " ".join(stmts[0].split()).startswith("ENTRY split_kv_partials_impl<DV, false, EARLYV>("), stmts
                uses = re.findall(r"TK_SPLITKV_K\((\w+), DV, MINB, (\w+), ([^)]*\)?;?)\)", text)
                assert uses[1:] == [("split_kv_partials", "false", "pdl_entry();"),   # ([0]: the definition)
                                    ("split_kv_early_partials", "true", "")], uses
            elif name == "skinny_gemm":
                assert stmts[0].startswith("if (prefetch) skinny_prefetch<") and \
                    stmts[1:] == ["pdl_wait()", "pdl_launch_dependents()"], (kname, stmts)
            else:
                assert stmts[0] == "pdl_entry()", f"{name}.cu {kname}: first statement {stmts[0]!r}, not pdl_entry()"
    assert seen >= len(kernels.SOURCES)
    params, body = kernels.source("skinny_gemm").split("void skinny_prefetch(")[1].split("{", 1)
    params = " ".join(params.split())
    assert params == "const __nv_bfloat16* __restrict__ w, int N, int K)"   # it sees the weights only
    assert "prefetch.global.L2" in body.split("\n}\n")[0]
    # the staged kernel: the producer (before "---- consumers") reads the weights only, by bulk copies that
    # follow its wait from stage `pre` on; the consumers' first statements are the wait and the trigger
    impl = kernels.source("skinny_gemm").split("void skinny_staged_impl(")[1].split("\n}\n")[0]
    producer = impl.split("// ---- producer")[1].split("// ---- consumers")[0]
    consumers = impl.split("// ---- consumers")[1]
    assert [ln.strip() for ln in consumers.strip().splitlines()[:2]] == ["pdl_wait();", "pdl_launch_dependents();"]
    early = "if (i == pre && !waited) {"
    assert early in producer and "pdl_wait();" in producer.split(early)[1].split("}")[0]
    assert producer.index(early) < producer.index("bulk_copy(")
    code = re.sub(r"//[^\n]*", "", producer)
    assert not re.search(r"(?<!\.)\b(x|y|ws|tickets|ldx)\b", code), "the producer touches nothing but the weights"
    # ... and the tile counter only after its wait: forced before the grab of a next tile, and the last
    # stage ("-1") comes only after such a grab (a CTA's first tile is its own index)
    grab = producer.index("atomicAdd(counters, 1)")
    assert "if (!waited) {\n          pdl_wait();" in producer[:grab].rsplit("if (++kc == kch)", 1)[1]
    assert "int t = blockIdx.x;" in producer and producer.count("t = next;") == 1
    # the cluster kernel: before its wait the producer copies weights only; x (the kernel before's output) after it;
    # the consumers wait first
    impl = kernels.source("skinny_gemm").split("void skinny_cluster_impl(")[1].split("\n}\n")[0]
    producer = impl.split("// ---- producer")[1].split("// ---- consumers")[0]
    consumers = impl.split("// ---- consumers")[1]
    assert [ln.strip() for ln in consumers.strip().splitlines()[:2]] == ["pdl_wait();", "pdl_launch_dependents();"]
    before, after = producer.split("\n", 1)[1].split("pdl_wait();", 1)    # (past the marker comment's line)
    code = re.sub(r"//[^\n]*", "", before)
    assert "tensor_copy(" in code and "wmap" in code and not re.search(r"(?<!\.)\b(xmap|y)\b", code), \
        "before the wait: the weights only"
    assert "tensor_copy_multicast(" in after and "xmap" in after and "tensor_copy_multicast(" not in before
    # gemm.cu's wide kernel: the same split as the warpgroup kernel's
    # (the trigger where its `trigger` argument asks: the SwiGLU launches let their successor be scheduled as they exit)
    impl = kernels.source("gemm").split("void gemm_wide_impl(")[1].split("\n}\n")[0]
    producer = impl.split("// ---- producer")[1].split("// ---- consumers")[0]
    consumers = impl.split("// ---- consumers")[1]
    assert [ln.strip() for ln in consumers.strip().splitlines()[:2]] == ["pdl_wait();",
                                                                          "if (trigger) pdl_launch_dependents();"]
    assert impl.count("pdl_launch_dependents()") == 2 and "if (trigger) pdl_launch_dependents();" in producer
    before, after = producer.split("\n", 1)[1].split("pdl_wait();", 1)
    code = re.sub(r"//[^\n]*", "", before)
    assert "tensor_copy(" in code and "tensor_copy5(" in code and "wmap" in code and \
        not re.search(r"(?<!\.)\b(xmap|y)\b", code), "before the wait: the weights only"
    assert "xmap" in after and "for (int i = 0; i < early; ++i) weights(i);" in before
    # the warpgroup kernel: the same split (its x copies are plain tensor copies after the wait)
    impl = kernels.source("skinny_wg").split("void skinny_wg_impl(")[1].split("\n}\n")[0]
    producer = impl.split("// ---- producer")[1].split("// ---- consumers")[0]
    consumers = impl.split("// ---- consumers")[1]
    assert [ln.strip() for ln in consumers.strip().splitlines()[:2]] == ["pdl_wait();", "pdl_launch_dependents();"]
    before, after = producer.split("\n", 1)[1].split("pdl_wait();", 1)
    code = re.sub(r"//[^\n]*", "", before)
    assert "tensor_copy(" in code and "wmap" in code and not re.search(r"(?<!\.)\b(xmap|y)\b", code), \
        "before the wait: the weights only"
    assert "xmap" in after


def test_the_fused_decode_attention_reads_before_its_wait_only_what_the_kernel_before_does_not_write():
    """``split_kv_qk_partials`` (``split_kv_partials_impl<D, true>``) waits inside the impl: before its
    ``pdl_entry()`` it reads only the step's metadata, the norm weights and RoPE tables (``job_weights``)
    and the first two K/V tiles less the new key's row; every read of the qkv rows (``norm_jobs``), every
    new-row fill and every write comes after it, on both the empty-split and the attending path."""
    impl = kernels.source("attention").split("void split_kv_partials_impl(")[1].split("\n}\n")[0]
    weights = impl.split("auto job_weights = [&]")[1].split("\n  };")[0]
    assert set(re.findall(r"qk\.(\w+)", weights)) == {"q_w", "k_w", "cos_t", "sin_t"}
    # the two waits of the QK path: the empty split's, and the attending CTAs' after the early copies
    empty = impl.split("if (s0l >= slen) {")[1].split("const int s0 = (int)s0l;")[0]
    qk_empty = empty.split("if constexpr (QK) {")[1].split("\n    }\n")[0]
    assert qk_empty.index("pdl_entry();") < qk_empty.index("norm_jobs(")
    assert empty.index("if constexpr (QK) {") < empty.index("out[") and empty.index("if constexpr (QK) {") < empty.index("o_part[")
    main = impl.split("const int s0 = (int)s0l;")[1]
    wait = main.index("pdl_entry();")
    before = main[:wait]
    assert before.count("load_kv_tile<D, BN, THREADS, true, true>(") == 2
    assert "lt == 0 ? lr : -1" in before and "lt == 1 ? lr : -1" in before
    code = re.sub(r"//[^\n]*", "", before)
    code = code.split("auto fill_new_row")[0] if "auto fill_new_row" in code else code
    assert not re.search(r"\b(norm_jobs|fill_new_row)\(|\bout\[|o_part\[|lse_part\[|tickets|qk\.(k|v|k_store|v_store)\b",
                         code), "the early region reads the qkv rows or writes"
    after = main[wait:]
    assert after.index("norm_jobs(0,") < after.index("fill_new_row(lt)")
    # the empty and the QK pre-wait regions before them (the prologue) read no qkv row either
    prologue = re.sub(r"//[^\n]*", "", impl.split("if (s0l >= slen) {")[0])
    prologue = prologue.split("auto norm_jobs = [&]")[0] + prologue.split("auto job_weights = [&]")[1]
    assert not re.search(r"qk\.(k|v|k_store|v_store)\b|\bout\[|o_part\[", prologue)


def test_the_early_decode_attention_reads_before_its_wait_only_what_qk_norm_rope_does_not_write():
    """``split_kv_early_partials`` (``split_kv_partials_impl<D, false, true>``) waits inside the impl: before
    its ``pdl_entry()`` it reads the step's metadata and the first two K/V tiles less each sequence's last key
    (the row qk_norm_rope's store writes); the query (``load_q``), the last key's row (``fill_new_row``) and
    every write come after it, on both the empty-split and the attending path."""
    impl = kernels.source("attention").split("void split_kv_partials_impl(")[1].split("\n}\n")[0]
    assert impl.count("if constexpr (!QK && !EARLY) load_q();") == 1       # the query before the wait: plain only
    empty = impl.split("if (s0l >= slen) {")[1].split("const int s0 = (int)s0l;")[0]
    early_empty = empty.split("} else if constexpr (EARLY) {")[1]
    assert early_empty.index("pdl_entry();") < early_empty.index("out[") and "o_part[" in early_empty
    last = impl.split("} else if constexpr (EARLY) {  // the last key")[1].split("\n  }\n")[0]
    assert "const int p_new = slen - 1;" in last and "lt = (p_new - s0) / BN;" in last
    region = impl.split("  if constexpr (QK || EARLY) {  // tiles 0 and 1")[1].split("\n  } else {\n#ifdef")[0]
    before, after = region.split("pdl_entry();")
    assert before.count("load_kv_tile<D, BN, THREADS, true, true>(") == 2
    assert "lt == 0 ? lr : -1" in before and "lt == 1 ? lr : -1" in before
    assert not re.search(r"load_q\(|fill_new_row\(|\bout\[|o_part\[|lse_part\[|tickets|\bq\b", before)
    assert re.sub(r"//[^\n]*", "", after.split("} else {")[1]).split() == ["load_q();", "}"]
    fill = impl.split("} else if constexpr (EARLY) {\n    if (lt == 0 || lt == 1) fill_new_row(lt);")
    assert len(fill) == 2 and impl.index("load_q();  // EARLY") < impl.index(fill[1])
    # in the key loop tile 1 is not loaded again; the fill takes the cache path (subst is QK's alone)
    assert "(!(QK || EARLY) || j + 1 >= 2)" in impl and "const bool subst = QK && " in impl


def test_auto_split_is_whole_decode_tiles():
    """``auto`` sizes splits in whole K/V tiles of the split-KV decode kernel (DecodeCfg::BN)."""
    from reference import attention
    src = (kernels.KERNEL_DIR / "attention.cu").read_text()
    bn = int(re.search(r"struct DecodeCfg \{.*?static constexpr int BN = (\d+)", src, re.S).group(1))
    assert bn == attention.AUTO_TILE
    for B in (1, 2, 8, 32, 128):
        for L in (1, 300, 1024, 4096, 16384):
            size = attention.split_size_for("auto", 0, [L] * B, 8)
            assert size % bn == 0 and size >= 2 * bn, (B, L, size)
            assert -(-L // size) <= attention.AUTO_MAX_SPLITS, (B, L, size)


def test_auto_split_fills_one_wave_of_decode_ctas():
    """``auto`` launches at most one wave of split-KV decode CTAs (``AUTO_CTAS_PER_SM`` per multiprocessor,
    the decode kernel's occupancy) and, within it, the smallest split size in whole tiles that is at least
    the minimum size and needs no more splits than fit (at most ``AUTO_MAX_SPLITS``)."""
    from reference import attention
    assert attention.AUTO_CTAS_PER_SM == ops.DECODE_CTAS_PER_SM      # the occupancy the decode launch asks for
    tile = attention.AUTO_TILE
    for sms in (132, 78):
        slots = attention.AUTO_CTAS_PER_SM * sms
        for B in (1, 2, 3, 4, 8, 16, 32, 33, 64, 128):
            for L in (1, 300, 1024, 4096, 16384, 100000):
                size = attention.split_size_for("auto", 0, [L] * B, 8, num_sms=sms)
                rows, splits = B * 8, -(-L // size)
                fits = min(attention.AUTO_MAX_SPLITS, max(1, slots // rows))
                min_size = tile * attention.AUTO_MIN_TILES[0 if rows <= sms // 16 else 1]
                assert size % tile == 0 and size >= min_size, (sms, B, L, size)
                assert splits <= fits and rows * splits <= max(slots, rows), (sms, B, L, size)
                smaller = size - tile                               # one tile less would need more splits
                assert smaller < min_size or -(-L // smaller) > fits, (sms, B, L, size)


def test_spill_allowances_name_inventoried_kernels_with_reasons():
    # build_check's exceptions to "no spill": each names a kernel that exists and says why (a measured trade)
    from optimized.kernels import build_check

    inventoried = {name for names in kernels.SOURCES.values() for name in names}
    assert set(build_check.SPILL_ALLOWANCE) <= inventoried
    for name, (stores, loads, why) in build_check.SPILL_ALLOWANCE.items():
        assert 0 < stores <= 16 and 0 < loads <= 64, name  # a few values outside the hot loop, not a loop's worth
        assert len(why.split()) >= 20, f"{name}: say where the spill is and what was measured"


def test_copies_take_their_cache_operator_per_kernel():
    """The measured choice of docs/performance/decode_attention.md ("The copies' cache operator"), which no output can
    show (a cache hint leaves every bit as it is, so only the source can hold it): the split-KV decode's
    K/V copies and the GEMM's tiles of at most 16 rows allocate in L1 (``cp.async.ca``), paged prefill's
    K/V copies bypass it (``.cg``), and ``-DTK_CP_ASYNC_CG`` makes every copy ``.cg`` again."""
    attn = (kernels.KERNEL_DIR / "attention.cu").read_text()
    prefill = attn[attn.index("void paged_prefill_impl("):attn.index("void split_kv_partials_impl(")]
    decode = attn[attn.index("void split_kv_partials_impl("):]
    assert decode.count("load_kv_tile<D, BN, THREADS, true>(") == 2
    assert decode.count("load_kv_tile<D, BN, THREADS, true, true>(") == 3      # the fused (QK) and early decode's
    assert decode.count("cp_async16_or_zero<true>(") == 2                      # ... and its new-key row's
    assert "load_kv_tile<D, BN, THREADS>(" not in decode
    assert prefill.count("load_kv_tile<D, BN, THREADS>(") == 2 and "load_kv_tile<D, BN, THREADS, true>(" not in prefill
    sw = attn[attn.index("void load_kv_tile_sw("):]
    sw = sw[:sw.index("\n}\n")]
    assert sw.count("cp_async16_or_zero(") == 2                  # the wgmma kernels' copies: .cg too
    assert "bool L1 = false, bool EXCEPT = false>\n__device__ __forceinline__ void load_kv_tile(" in attn  # .cg unless asked
    gemm = (kernels.KERNEL_DIR / "gemm.cu").read_text()
    assert "constexpr bool L1 = BM <= 16;" in gemm and gemm.count("cp_async16<L1>(") == 2
    header = (kernels.KERNEL_DIR / "mma.cuh").read_text()
    switch = header[header.index("#ifdef TK_CP_ASYNC_CG"):header.index("#endif")]
    assert re.search(r"#ifdef TK_CP_ASYNC_CG\n#define TK_CP_L1\(l1\) false\n#else\n#define TK_CP_L1\(l1\) \(l1\)\n", switch)
    for fn in ("void cp_async16(", "void cp_async16_or_zero("):
        body = header[header.index(fn):]
        body = body[:body.index("\n}\n")]
        assert "if constexpr (TK_CP_L1(L1))" in body and "cp.async.ca." in body and "cp.async.cg." in body
        assert body.index("cp.async.ca.") < body.index("else") < body.index("cp.async.cg."), fn


def test_every_plain_kernel_definition_is_inventoried():
    """Each ``extern "C" __global__`` kernel a source defines by name (not through a macro) is listed in
    ``kernels.SOURCES`` under that source (``load_all`` and the launch checks go by the inventory)."""
    pattern = re.compile(r'extern "C" __global__ void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\(')
    found = 0
    for name, listed in kernels.SOURCES.items():
        text = (kernels.KERNEL_DIR / f"{name}.cu").read_text()
        text = re.sub(r"#define(?:[^\n]*\\\n)*[^\n]*", "", text)            # macro bodies name no kernel
        for kernel in pattern.findall(text):
            found += 1
            assert kernel in listed, f"{name}.cu defines {kernel}, which kernels.SOURCES[{name!r}] does not list"
    assert found >= 10, "the pattern matched almost nothing: it no longer fits the sources"


def test_build_check_reads_wgmma_serialization_advisories():
    # the two ptxas advisories that mean a kernel's warpgroup MMAs were serialized fail the compile check
    from optimized.kernels import build_check
    log = "\n".join([
        "ptxas info    : (C7517) warpgroup.wait is injected in around line 935 by compiler to allow use of "
        "registers defined by GMMA in function 'skinny_wg_k128s8n32t1p1_bf16'",
        "ptxas info    : Compiling entry function 'skinny_wg_k128s8n32t1p1_f32' for 'sm_90a'",
        "ptxas info    : (C7518) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
        "program dependence on compiler-inserted WG.DP in divergent path in the function 'paged_prefill_d128'",
        "ptxas info    : Used 42 registers, used 1 barriers, 256 bytes smem",
    ])
    assert build_check.wgmma_advisories(log) == [("C7517", "skinny_wg_k128s8n32t1p1_bf16"),
                                                 ("C7518", "paged_prefill_d128")]
    assert build_check.wgmma_advisories("ptxas info    : Used 42 registers") == []
