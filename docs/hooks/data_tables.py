"""MkDocs hook: tables of kvplan's bundled data, generated at build time so they cannot drift.

Each marker below, where a page holds it, is replaced by a Markdown table read from kvplan's own
data files:

- ``<!-- gpu-table -->``: ``kvplan/sizing/data/gpus.yaml`` and ``gpu_perf.yaml``, the GPUs
  ``kvplan estimate --gpu`` accepts and the speeds ``kvplan simulate`` uses;
- ``<!-- model-presets -->``: ``kvplan/sizing/data/models/*.json``, the presets ``--model`` accepts;
- ``<!-- calibrations -->``: ``kvplan/run/sim/calibration/data/*.json``, the shipped step-time calibrations.

Needs kvplan importable (the project's .venv); a data file that cannot be read fails the build.
"""

from __future__ import annotations

import json


def on_page_markdown(markdown: str, page, config, files) -> str:
    for marker, table in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, table())
    return markdown


def gpu_table() -> str:
    """One row per GPU: names, memory as the driver reports it, the speeds kvplan simulate uses
    (dense TFLOP/s, GB/s; blank where the GPU has no figures: simulate refuses it; ``none`` for
    FP8 / FP4 where a GPU with figures has no such tensor cores) and the aiconfigurator-core
    system that is the same GPU (``silicon_system``; blank where there is none)."""
    import yaml

    from kvplan.sizing.gpus.gpu_perf import GPU_PERF_FILE
    from kvplan.sizing.gpus.gpus import gpu_table as gpus

    perf = yaml.safe_load(GPU_PERF_FILE.read_text())["gpus"]
    rows = [
        "| GPU | aliases | memory GiB | as reported by | BF16 TFLOP/s | FP8 TFLOP/s | FP4 TFLOP/s | HBM GB/s "
        "| link GB/s | aiconfigurator system |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, entry in sorted(gpus().items()):
        speed = perf.get(name, {})
        cells = [
            f"`{name}`",
            ", ".join(f"`{a}`" for a in entry.get("aliases", [])),
            f"{entry['memory_gib']:g}",
            entry.get("reported_by", ""),
        ]
        speeds = ("bf16_tflops", "fp8_tflops", "fp4_tflops", "hbm_gbps", "link_gbps")
        cells += [_number(speed.get(key)) for key in speeds]
        for column, key in ((5, "fp8_tflops"), (6, "fp4_tflops")):
            if speed and speed.get(key) is None:
                cells[column] = "none"
        system = speed.get("silicon_system")
        cells.append(f"`{system}`" if system else "")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def preset_table() -> str:
    """One row per bundled preset: the short name and the Hugging Face id it was read from."""
    from kvplan.sizing.models.model_source import PRESETS_DIR

    rows = ["| preset | model | Hugging Face id |", "|---|---|---|"]
    for path in sorted(PRESETS_DIR.glob("*.json")):
        entry = json.loads(path.read_text())
        rows.append(f"| `{path.stem}` | {entry['name']} | `{entry['hf_id']}` |")
    return "\n".join(rows) + "\n"


def calibration_table() -> str:
    """One row per shipped calibration: the engine it is valid for, its fit, and the run it was
    fitted on (coefficients in ms per unit of work)."""
    from kvplan.run.sim.calibration.store import DATA_DIR

    rows = ["| calibration | engine | fit | step time | fitted on |", "|---|---|---|---|---|"]
    for path in sorted(DATA_DIR.glob("*.json")):
        entry = json.loads(path.read_text())
        engine = entry["engine"]
        terms = [f"{entry['intercept_s'] * 1e3:.3g} ms"]
        terms += [
            f"{value * 1e3:.3g} ms x {name.removeprefix('num_').replace('_', ' ')}"
            for name, value in entry["coefficients"].items()
        ]
        rows.append(
            f"| `{entry['name']}` | {engine['model']}, {engine['dtype']}, KV {engine['kv_cache_dtype']}, "
            f"block {engine['block_size']}, {engine['device']} | R² {entry['r2']:.3f} over "
            f"{entry['num_steps']:,} steps | {' + '.join(terms)}; gap {entry['gap_s'] * 1e3:.2f} ms "
            f"| {entry['source'].split(',')[0]} |"
        )
    return "\n".join(rows) + "\n"


def _number(value) -> str:
    return "" if value is None else f"{value:,g}"


MARKERS = {
    "<!-- gpu-table -->": gpu_table,
    "<!-- model-presets -->": preset_table,
    "<!-- calibrations -->": calibration_table,
}
