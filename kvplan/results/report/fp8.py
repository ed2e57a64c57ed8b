"""summary.md's FP8 KV cache section: the calibrated scales and the quality check's numbers.

Present only for a run whose engine kept its KV in fp8 (``engine.kv_scales`` in results.json); the
quality table only when the check ran (``fp8_quality``). Definitions as in kvplan.run.bundled.fp8_quality.
"""

from __future__ import annotations

import pandas as pd

from kvplan.results.report import tables
from kvplan.results.run_result import Fp8QualityResult, RunResult

DEFINITIONS = (
    "Reference: the same model and dtype with KV in the model dtype, same settings and number of blocks"
    " (enough that neither preempts), so both engines schedule the same batches. Greedy (ignore_eos): per"
    " prompt, the leading positions"
    " of the first T tokens where both agree (first divergence); prefix agreement = mean first"
    " divergence / T; exact match = all T tokens equal. KL of reference to fp8 = KL(p_ref || p_fp8) ="
    " sum_v p_ref(v) ln(p_ref(v) / p_fp8(v)) in nats, at every teacher-forced reply position (prompt +"
    " the first T tokens of its reply, the real one for ShareGPT, scored through the paged cache),"
    " averaged over all positions; top-1 = both engines' most likely next token is the same."
)


def quality_table(quality: Fp8QualityResult) -> pd.DataFrame:
    """One row per measure of the check."""
    t = quality.num_tokens
    rows = [
        (f"greedy prefix agreement (first {t} tokens)", quality.prefix_agreement),
        (f"exact {t}-token matches (fraction of prompts)", quality.exact_match_rate),
        ("mean first divergence (tokens)", quality.mean_first_divergence),
        (f"mean KL of reference to fp8, nats, over {quality.num_kl_positions} reply positions", quality.mean_kl),
        ("max KL, nats", quality.max_kl),
        ("teacher-forced top-1 agreement", quality.top1_agreement),
    ]
    return pd.DataFrame(rows, columns=["measure", "value"])


def fp8_markdown(result: RunResult) -> list[str]:
    """The section's Markdown lines ([] when the run did not use an fp8 KV cache)."""
    scales = result.engine.kv_scales if result.engine else None
    if not scales:
        return []
    k, v = scales.k_scales or [0.0], scales.v_scales or [0.0]
    lines = [
        "",
        "## FP8 KV cache (e4m3)",
        "",
        f"- Scales: per layer, amax / 448 (e4m3's largest finite value) of K (after RoPE) and of V,"
        f" calibrated on {scales.num_calibration_prompts} of this run's prompts"
        f" ({scales.num_calibration_tokens} tokens) before the first step: K {min(k):.3g}..{max(k):.3g},"
        f" V {min(v):.3g}..{max(v):.3g} over {len(k)} layers (each in results.json, engine.kv_scales).",
    ]
    quality = result.fp8_quality
    if not quality:
        lines.append("- Quality check: not run (fp8_quality.num_prompts is 0, or the run did not complete).")
        return lines
    lines += [
        f"- Quality check: {quality.model} in {quality.dtype} on {quality.num_prompts}"
        f" prompts, {quality.prompts}; fp8 scales calibrated on the run's"
        f" {quality.num_calibration_prompts} calibration prompts; took {quality.seconds:.1f} s.",
        "",
        tables.to_markdown(quality_table(quality)).rstrip("\n"),
        "",
        DEFINITIONS,
    ]
    return lines
