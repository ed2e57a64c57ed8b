"""Console views of a calibration: the fit, its held-out levels, and the run's drift check."""

from __future__ import annotations

from kvplan.run.sim.calibration.store import Calibrated


def print_calibration(calibrated: Calibrated, console) -> None:
    """R², the fitted coefficients, each held-out level's error, and any drift warning (yellow)."""
    from rich.table import Table

    fit, calibration = calibrated.fit, calibrated.calibration
    model = fit.model
    terms = ", ".join(f"{name.removeprefix('num_')} {value * 1e6:.3g} us" for name, value in model.coefficients.items())
    console.print(
        f"calibration: {calibration.source}: R² {fit.r2:.3f} over {fit.num_steps:,} steps "
        f"({fit.num_outliers} outliers dropped); step = {model.intercept_s * 1e3:.2f} ms + {terms} each;"
        f" gap {model.gap_s * 1e3:.2f} ms"
        + (f"; front end {calibration.front_end_s * 1e3:.1f} ms" if calibration.front_end_s else "")
        + (
            "; step jitter P10/P50/P90 "
            + "/".join(f"{calibration.jitter_s[p] * 1e3:+.1f}" for p in (10, 50, 90))
            + " ms (drawn per step)"
            if calibration.jitter_s
            else ""
        ),
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    table = Table(title="Held-out levels (fitted without the level, predicting its steps)")
    for column in ("level", "steps", "median |step error| %", "total time error %"):
        table.add_column(column, justify="left" if column == "level" else "right")
    for e in fit.held_out:
        table.add_row(e.level, f"{e.num_steps:,}", f"{e.median_abs_step_error_pct:.1f}", f"{e.total_error_pct:+.1f}")
    console.print(table)
    for drift in calibrated.drift:
        console.print(f"warning: {drift.describe()}", style="yellow", markup=False, highlight=False, soft_wrap=True)
