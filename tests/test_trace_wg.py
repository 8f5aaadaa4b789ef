"""The host side of ``benches/gpu/trace_wg.py`` on the CPU: its records (the layout ``skinny_wg.cu`` writes under
``-DTK_WG_TRACE``) grouped into launches, named by role, and summed into the two tables it prints. The trace costs
device time, so its arithmetic is held here before a run reads anything into it."""

from __future__ import annotations

import importlib
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
for sub in ("benches", "benches/gpu"):
    sys.path.insert(0, str(ROOT / sub))
trace_wg = importlib.import_module("trace_wg")
for sub in ("benches", "benches/gpu"):
    sys.path.remove(str(ROOT / sub))

from reference.config import named_config  # noqa: E402

CFG = named_config("qwen3-0.6b")


def record(marks: list[int], block: int, rank: int, grid: int, N: int, K: int, flags: int,
           land: tuple[int, ...] = ()) -> list[int]:
    """One CTA's record: 7 marks (ns), then SM | block | rank, grid | N, K | flags, then 8 stage sightings (0: none)."""
    return [*marks, (block % 132) << 32 | block << 8 | rank, grid << 32 | N, K << 32 | flags,
            *land, *[0] * (8 - len(land))]


def fake_step() -> list[list[int]]:
    """An o_proj launch of 8 CTAs in clusters of 4 (CTA 6, rank 2, finishes its MMAs 2 µs late), then the LM head."""
    rows = []
    for c in range(8):
        mma = 4000 if c == 6 else 2000 + 10 * c
        rows.append(record([900, 1000 + c, 1500 + c, mma, mma + 100, mma + 200, 5000], c, c % 4, 8,
                           CFG.hidden_size, CFG.num_attention_heads * CFG.head_dim, 0,
                           tuple(1500 + c + 100 * s for s in range(4))))
    for c in range(2):
        rows.append(record([5100, 5500 + c, 5600, 9000, 9000, 9100, 9500 + c], c, 0, 2, CFG.vocab_size,
                           CFG.hidden_size, 32))
    return rows[::-1]   # the device's order is arbitrary: grouping sorts by the wait mark


def test_records_group_into_launches_by_role():
    step = trace_wg.one_step(trace_wg.launches(fake_step(), CFG))
    assert [(lch["role"], lch["grid"]) for lch in step] == [("o_proj", 8), ("lm_head", 2)]
    rep = trace_wg.report(step)
    assert rep["o_proj"]["span"] == pytest.approx(4.0)          # first wait 1000 -> last end 5000
    assert rep["lm_head"]["gap"] == pytest.approx(0.5)          # its first wait 5500 after o_proj's end 5000
    assert rep["o_proj"]["waits"] == pytest.approx(0.007)       # the CTAs' waits spread over 7 ns


def test_tails_name_the_slowest_cta_and_its_rank():
    step = trace_wg.one_step(trace_wg.launches(fake_step(), CFG))
    tails = trace_wg.tails(step)["o_proj"]
    print(tails)
    # the slowest CTA (6) by its last MMA, as offsets from the first wait: start, wait, first, mma, fold, store, end
    assert tails["slowest"] == pytest.approx([-0.1, 0.006, 0.506, 3.0, 3.1, 3.2, 4.0])
    # the median of 8 by the last MMA: CTA 4 (sorted 0..5, 7, 6; index 4)
    assert tails["median"][3] == pytest.approx(1.04)
    # rank 2 holds CTAs 2 and 6: its median last MMA is theirs (1.02, 3.0); the other ranks' under 1.1 µs
    assert tails["mma by rank"][2] == pytest.approx(2.01)
    assert max(tails["mma by rank"][r] for r in (0, 1, 3)) < 1.1


def test_a_short_launch_is_refused():
    rows = fake_step()[1:]   # one LM head CTA missing
    with pytest.raises(RuntimeError, match="not one launch's CTAs"):
        trace_wg.launches(rows, CFG)


def test_landings_of_watched_stages_only():
    step = trace_wg.one_step(trace_wg.launches(fake_step(), CFG))
    land = trace_wg.landings(step)
    # the LM head's records watched no stage: no row; o_proj's 4 stages land 0.1 µs apart from its CTAs' first,
    # medians over CTAs 0..7 (1500 + 3.5 + 100 s - 1000 ns), then the median last MMA (2035 - 1000 ns: the mean of the middle two)
    assert list(land) == ["o_proj"]
    assert land["o_proj"] == pytest.approx([0.5035, 0.6035, 0.7035, 0.8035, 1.035])
