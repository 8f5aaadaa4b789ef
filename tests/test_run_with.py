"""``benches/gpu/run_with.py`` on the CPU: the script it runs sees the extra build defines and its own arguments."""

from __future__ import annotations

import importlib
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benches" / "gpu"))
run_with = importlib.import_module("run_with")
sys.path.remove(str(ROOT / "benches" / "gpu"))


def test_defines_and_arguments_reach_the_script(tmp_path, monkeypatch):
    import optimized.kernels as kernels

    monkeypatch.setattr(kernels, "OPTIONS", tuple(kernels.OPTIONS))   # restored after the test
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    out = tmp_path / "seen.json"
    script = tmp_path / "script.py"
    script.write_text("import json, sys\nimport optimized.kernels as k\n"
                      f"json.dump({{'options': list(k.OPTIONS), 'argv': sys.argv[1:]}}, open({str(out)!r}, 'w'))\n")
    before = tuple(kernels.OPTIONS)
    run_with.main(["--define", "TK_A", "--define", "TK_B", str(script), "--models", "qwen3-0.6b", "--batches", "32"])
    seen = json.loads(out.read_text())
    assert seen["options"] == [*before, "-DTK_A", "-DTK_B"]
    assert seen["argv"] == ["--models", "qwen3-0.6b", "--batches", "32"]
