"""The contract's clauses, as data: stable ids, statements, tolerance rules.

This module is the single source of ``docs/contract.md``: ``python -m conformance.clauses``
re-renders it (a meta-test fails when the committed file is stale). Every contract test
carries exactly one clause marker, ``@pytest.mark.clause("TURN")`` (usually as the module's
``pytestmark``), and every failure message names its clause (``harness.fail``).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Clause:
    id: str
    title: str
    statement: str
    tolerance: str
    module: str | None          # the test module that carries it (None: no tests yet)
    status: str = "active"      # "active" | "pending"


CLAUSES: dict[str, Clause] = {c.id: c for c in [
    Clause(
        "TURN", "multi-turn rollout equals single-shot generation",
        "Greedy multi-turn rollout equals single-shot `generate` over the concatenated context, token for "
        "token: turn k's tokens = `generate(P + t1 + O1 + ... + O(k-1))`, with the same stop reason; across "
        "batch compositions (all together, one at a time, staggered admission, chunked prefill), empty "
        "observations, observations spanning many blocks, prompts and contexts ending on block boundaries, "
        "and the context limit. The trajectory is the exact concatenation (assistant mask, logprobs aligned, "
        "spans, per-turn budget).",
        "Tokens: a mismatch is allowed only at a step whose fp32-oracle top-1/top-2 margin is at most the "
        "noise bound (in fp32 that bound is a few float32 rounding steps, so fp32 is exact up to ties); the "
        "comparison then re-anchors with `generate` from the engine's own tokens. The compared share of "
        "steps is reported and expected to be 90% (required: less 3 binomial standard deviations, the Shares "
        "rule below). Bookkeeping (trajectory, masks, spans, stop rule): exact.",
        "test_turn"),
    Clause(
        "ORACLE", "greedy tokens equal the no-cache oracle",
        "Greedy tokens (from `generate` and from multi-turn rollouts) equal the no-cache oracle "
        "(`reference.oracle`: full fp32 recompute of the context at every step, same weights) wherever the "
        "oracle's top-1/top-2 logit margin exceeds the noise bound; sampled-token logprobs equal the "
        "oracle's log-softmax; stop rules are those of the oracle. The share of decisive steps is reported "
        "and must reach the stated minimum, so the clause never passes vacuously.",
        "Decisive step: oracle margin > noise bound (1 x the LOGIT bound + the float32 floor). Tokens "
        "compared teacher-forced along the engine's own context (identical to the free-running oracle up "
        "to the first divergence, which is only legal at a non-decisive step). Expected decisive share: "
        "80% in float32, 30% in bfloat16/float16 (random weights give small margins; measured about 70% "
        "at the CI shapes and 29-34% at the qwen3-0.6b shape in bf16 on an H200); required: that share "
        "less 3 binomial standard deviations at the number of steps (the Shares rule below). Free-running check "
        "(`oracle_generate` run free against `generate`): at a divergence on a non-decisive step the oracle "
        "re-anchors on the engine's own tokens (as TURN re-anchors `generate`) and the comparison goes on, "
        "so every engine step is judged; an oracle run that meets no divergence must end where the engine's "
        "turn ends. Its expected decisive share over all steps of all prompts is 1/3 of the ORACLE share (26.7% "
        "in float32, 10% in bfloat16; required less 3 binomial standard deviations): its token decisions "
        "repeat the teacher-forced checks, which carry the full share. Logprobs: |engine - oracle| <= 2 x noise "
        "bound at every assistant step.",
        "test_oracle"),
    Clause(
        "LOGIT", "teacher-forced logits match the fp32 oracle",
        "`engine.score(ids)` returns float32 `[T, vocab]` on the CPU whose error against the fp32 oracle "
        "(Hugging Face `Qwen3ForCausalLM`, same weights, fp32, eager attention, explicit attention mask) "
        "obeys the flash-attention rule, for the max and for the mean absolute error; cosine similarity is "
        "reported. A prefix scores like the prefix rows of the whole sequence.",
        "err_engine <= 2 x err_reference(dtype) + ulp(dtype, max|oracle logit|), separately for max and "
        "mean |error|, where err_reference is the reference engine run in the engine's dtype on the same "
        "weights and ids (in float32: the float32 reference itself; at a GPU-only shape, the reference "
        "model math in that dtype on the oracle device, see Shapes and scales).",
        "test_logit"),
    Clause(
        "SPLITK", "split-KV decode is NaN-free and equals the unsplit result",
        "`kernels.split_kv_decode` is NaN-free for every split size (1 token up to more than the whole "
        "sequence; more splits than blocks; split sizes that are not multiples of the block size), with "
        "stale NaN pages, zero-length splits and zero-length sequences, and equals the unsplit fp32 result "
        "within the LOGIT rule. `split_kv_partials` writes `o = 0, lse = -inf` for empty splits and the "
        "oracle's partials otherwise; `merge_states` merges in `global_block_index` order, NaN-free with "
        "empty states. Every `TurnOutput` reports the policy in force.",
        "The LOGIT rule on the attention output: err <= 2 x err_reference(dtype) + ulp(dtype, max|oracle|), "
        "where the oracle is an independent dense fp32 attention over the dtype-rounded inputs and "
        "err_reference is the reference kernel math run on the same dtype inputs.",
        "test_splitk"),
    Clause(
        "PAGED", "paged continued prefill",
        "`kernels.paged_prefill`: each real query attends causally by absolute position over its "
        "sequence's pages; GQA (group 1, 2, 4, ...), prefixes and chunks ending on and across block "
        "boundaries, empty prefix (fresh prompt), several sequences in one launch with padding rows "
        "(`q_pos < 0` gives exact zeros), shuffled page ids, stale NaN pages never read.",
        "The LOGIT rule on the attention output (as SPLITK); padding rows exactly 0.",
        "test_paged"),
    Clause(
        "STATE", "state machine and typed errors",
        "WAITING -> RUNNING -> PAUSED -> (continue) WAITING -> ... -> FINISHED, as DESIGN section 2. "
        "Every bad input gets its typed error (`reference.errors`) and leaves `engine.snapshot()` and the "
        "free block count unchanged: unknown or finished sequence ids, continue on a non-paused sequence, "
        "token ids outside the vocabulary or malformed, an observation or prompt past the context limit, "
        "bad sampling parameters, block tables / query positions failing the launch guards, bad partial "
        "state merges. After rejected calls the engine still produces the clean run's tokens.",
        "Exact (types and snapshots).",
        "test_state"),
    Clause(
        "MEM", "blocks: delta growth, no leak, paused accounted",
        "A resumed sequence prefills exactly `[pending] + observation` and grows its block table by the "
        "delta only (its old table is a prefix of the new one); every block is free again after finish "
        "(and after `generate`); paused sequences keep their blocks and are counted (free + all tables = "
        "pool, tables disjoint) at every point; a pool too small for everything completes every "
        "trajectory without loss and without deadlock, with the big-pool tokens.",
        "Exact counts; tokens compared as in TURN.",
        "test_mem"),
    Clause(
        "SAMPLE", "seeded sampling",
        "Seeded sampling (temperature, top-k, top-p; randomness a function of (seed, absolute position)) "
        "is reproducible run to run and on a fresh engine, independent of batch mates, independent of how "
        "the context was split into turns, and identical to the reference sampler on the fp32 oracle's "
        "logits where margins allow; logprobs follow `logprobs_mode`.",
        "Run to run: exact. Elsewhere a step counts where the reference sampler picks the same token "
        "under every perturbation of the oracle logits by half the noise bound (the winner lowered and "
        "the rest raised, and each near competitor raised alone); other steps are excused. Minimum robust "
        "share as ORACLE. Logprobs within 2 x noise bound.",
        "test_sample"),
    Clause(
        "INVARIANT", "batch-invariant mode",
        "In batch-invariant mode (`batch_invariant=True`) a sequence's logits are bitwise identical whatever "
        "its batch mates and however its context was split into turns (a resumed turn vs one prefill of the "
        "concatenated context), observed as its sampled tokens and logprobs. An engine without the mode "
        "rejects it with `ConfigError` and the tests are skipped with that reason (never counted as passes).",
        "Bitwise.",
        "test_invariant"),
]}


def clause_ids() -> list[str]:
    return list(CLAUSES)


# ---------------------------------------------------------------------------------- rendering

_HERE = Path(__file__).resolve().parent


def tests_of(clause: Clause) -> list[tuple[str, str]]:
    """``(test name, first docstring line)`` for every test function in the clause's module (parsed, not imported)."""
    if clause.module is None:
        return []
    path = _HERE / f"{clause.module}.py"
    tree = ast.parse(path.read_text())
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            doc = (ast.get_docstring(node) or "").strip().splitlines()
            out.append((node.name, doc[0] if doc else ""))
    return out


TOLERANCE_RULES = """\
## Tolerance rules

All oracles run in float32 (on the CPU, or with `--oracle-device cuda` on a GPU, TF32 off) on the **same
weights** as the engine under test: the harness draws them with `reference.weights.random_weights`
(rounded to bfloat16-representable values, so a bf16 engine and the fp32 oracle compute with identical
weights) and hands them to both; a GPU-only shape draws them by the same rule on the GPU (see Shapes and
scales).

* **ulp(dtype, m)**: one rounding step of `dtype` at magnitude `m`: `2 ** (floor(log2 m) - mantissa_bits)`
  with 23 (float32), 7 (bfloat16), 10 (float16) mantissa bits. `m` is the max |oracle value| of the
  compared tensor.
* **LOGIT rule (the flash-attention rule)**: `err_engine <= 2 * err_reference + ulp(dtype, m)`, where
  `err_reference` is the error of the reference implementation run in the engine's dtype against the same
  fp32 oracle on the same inputs (float32 engines: the float32 reference). Applied to the max and to the
  mean absolute error. Used by LOGIT (model logits; oracle: Hugging Face `Qwen3ForCausalLM`, eager
  attention), SPLITK and PAGED (attention outputs; oracle: dense fp32 attention over the dtype-rounded
  inputs).
* **Noise bound** (for token decisions): `noise = B + 64 * ulp(float32, m)`, where `B` is the LOGIT
  bound measured per (model, dtype) on a probe of random sequences (reference in the dtype vs the fp32
  no-cache oracle) and the second term is a float32 accumulation floor (different but correct reduction
  orders differ by a few float32 steps). A greedy step is **decisive** when the oracle's top-1/top-2
  margin exceeds `DECISIVE_MULTIPLE * noise` (`DECISIVE_MULTIPLE = 1`). Logprob comparisons allow
  `2 * noise` (a log-softmax moves by at most twice the largest logit change).
* **Sampling robustness**: a sampled step is decisive when `reference.sampling.sample_one` returns the
  same token for the oracle logits and for their adversarial perturbations by `noise / 2` per logit (the
  winner lowered and every other entry raised; each competitor within reach raised alone).
* **Shares** (never pass vacuously): ORACLE and SAMPLE expect a decisive share of 80% (float32)
  or 30% (bfloat16 / float16); TURN expects a compared share of 90%. ORACLE's free-running
  check, re-anchored after each legal divergence so that every step counts, expects a third of the
  ORACLE share (`FREE_RUNNING_SHARE_FRACTION`). Which steps are decisive depends on the trajectory,
  and the trajectory on the engine's last bits at near-ties, so over n steps the observed share
  scatters like a binomial proportion: a clause requires the expected share p less
  `SHARE_SIGMAS = 3` standard deviations, `p - 3 sqrt(p (1 - p) / n)` (`share_floor`). This is a
  coverage floor, not an accuracy tolerance: every decisive or compared step is checked exactly.
  Shares and floors are printed.

The constants live in `conformance/tolerance.py`.
"""


def shapes_and_scales() -> str:
    """The "Shapes and scales" section, rendered from ``conformance/cases.py``."""
    from . import cases   # torch and the reference, imported only to render

    lines = ["## Shapes and scales", "",
             "`--conformance-scale ci` (the default; CI has no GPU) runs every test at the tiny shapes " +
             ", ".join(f"`{m}`" for m in cases.SCALES["ci"].models) + ". `--conformance-scale gpu` adds " +
             ", ".join(f"`{m}`" for m in cases.SCALES["gpu"].models if m not in cases.SCALES["ci"].models) +
             " and larger workloads; select one shape with `-k` (`-k qwen3-0.6b`, `-k qwen3-8b`).", ""]
    for name, shape in cases.GPU_SHAPES.items():
        cfg = cases.model_config(name)
        lines += [
            f"**{name}** is a GPU-only shape ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
            f"{cfg.num_attention_heads} query / {cfg.num_key_value_heads} KV heads of {cfg.head_dim}, vocab "
            f"{cfg.vocab_size}, untied lm_head), at the gpu scale only, and only these tests are collected at it:",
            ""]
        lines += [f"* `conformance/{t.replace('::', '.py::')}`" for t in sorted(shape.tests)]
        lines += [
            "",
            "Its weights are drawn with `reference.weights.random_tensor`'s rule (per-name seed, same "
            "scales) by a CUDA generator, in bfloat16 on the GPU (`cases.draw_on_cuda`: deterministic, "
            "but not the CPU generator's values). The fp32 oracles run on the oracle device, and "
            "`err_reference` of the LOGIT rule (and of the noise bound) is the reference model math "
            "(`reference.model.Qwen3Model`) in the engine's dtype on the oracle device, with float32 "
            "accumulation (reduced-precision bf16 reductions off): for one fresh sequence it is the "
            "reference engine's `score` term for term. Each test skips, with the reason, when the shape "
            "cannot run: no CUDA GPU, `--oracle-device` not `cuda`, an engine under test on the CPU, or a "
            f"GPU with less than {shape.min_gpu_gib:.0f} GiB.",
            ""]
    return "\n".join(lines)


def _cell(text: str) -> str:
    """A markdown table cell: literal pipes escaped."""
    return text.replace("|", "\\|")


def render_markdown() -> str:
    lines = [
        "# The turnkv contract",
        "",
        "<!-- generated by `python -m conformance.clauses` from conformance/clauses.py; do not edit -->",
        "",
        "Any engine is judged by `pytest conformance --engine reference|optimized|pkg.module:factory` "
        "(or `nox -s conformance -- --engine optimized`). Each clause has a stable id, carried by its tests "
        "as a marker (`-m TURN` selects them) and named in every failure message, which also carries a "
        "repro snippet.",
        "",
        "| id | statement | tests | tolerance |",
        "| --- | --- | --- | --- |",
    ]
    for c in CLAUSES.values():
        tests = tests_of(c)
        tcell = "<br>".join(f"`{c.module}.py::{name}`" for name, _ in tests) if tests else f"none yet ({c.status})"
        lines.append(f"| **{c.id}** | {_cell(c.statement)} | {tcell} | {_cell(c.tolerance)} |")
    lines += ["", TOLERANCE_RULES, shapes_and_scales(), "## Tests by clause", ""]
    for c in CLAUSES.values():
        lines.append(f"### {c.id}: {c.title}")
        lines.append("")
        tests = tests_of(c)
        if not tests:
            lines.append(f"No tests yet: {c.status}.")
        for name, doc in tests:
            lines.append(f"* `conformance/{c.module}.py::{name}`: {doc}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


CONTRACT_PATH = _HERE.parent / "docs" / "contract.md"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render_markdown()
    if "--check" in argv:
        ok = CONTRACT_PATH.is_file() and CONTRACT_PATH.read_text() == text
        print("docs/contract.md is up to date" if ok else "docs/contract.md is stale: run python -m conformance.clauses")
        return 0 if ok else 1
    CONTRACT_PATH.parent.mkdir(parents=True, exist_ok=True)
    CONTRACT_PATH.write_text(text)
    print(f"wrote {CONTRACT_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
