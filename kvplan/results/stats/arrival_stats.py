"""Open-loop arrivals in the run result: the spread of inter-arrival gaps a level asked for, and the
one its requests show.

The spread is the coefficient of variation (CV = std / mean) of the gaps between consecutive
arrivals. Requested, by the bucket's ``arrival.process`` (kvplan.workload.arrivals): ``poisson`` 1
(exponential gaps), ``gamma`` 1 / sqrt(burstiness) (Gamma(shape=B, scale=1/(rate*B)) gaps, as
``vllm bench serve --burstiness``), ``constant`` 0. Achieved: numpy's population std (ddof=0)
over the mean of the gaps between a level's sorted arrival times, over all its requests (warm-up
and cool-down ones too); a ``ramp_up_s`` adds the ramp's changing rate to it.

The settings are read back from the run result's workload config (``RunResult.workload.config``:
the validated workload, defaults filled in), so ``results`` needs nothing of ``load``; a run
recorded before ``arrival:`` existed reads as Poisson.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from kvplan.results.records import LevelKey, RequestRecord


class ArrivalSettings(BaseModel):
    """A bucket's ``arrival:`` as the run result's workload config holds it (the schema is
    kvplan.workload.arrivals.Arrival's): the process, gamma's burstiness B and the ramp-up, s."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    process: str = "poisson"
    burstiness: float = 1.0
    ramp_up_s: float = 0.0


def requested_cv(process: str, burstiness: float = 1.0) -> float | None:
    """The inter-arrival CV a process asks for: poisson 1, gamma 1 / sqrt(B), constant 0 (None for
    a process this kvplan does not know)."""
    if process == "gamma":
        return 1.0 / math.sqrt(burstiness)
    return {"poisson": 1.0, "constant": 0.0}.get(process)


def achieved_cv(arrival_times: Sequence[float]) -> float | None:
    """std / mean of the gaps between consecutive sorted ``arrival_times`` (seconds), numpy's
    population std (ddof=0); None with fewer than 3 arrivals (2 gaps) or gaps that sum to 0."""
    if len(arrival_times) < 3:
        return None
    gaps = np.diff(np.sort(np.asarray(arrival_times, dtype=np.float64)))
    mean = float(gaps.mean())
    return float(gaps.std(ddof=0)) / mean if mean > 0 else None


def bucket_arrivals(config: Mapping[str, Any]) -> dict[str, ArrivalSettings]:
    """Bucket name -> its ``arrival:`` settings, from a workload config dict; buckets without one
    (or with one this kvplan cannot read) are absent: Poisson."""
    found = {}
    for bucket in config.get("buckets") or []:
        if not isinstance(bucket, dict) or not isinstance(bucket.get("arrival"), dict):
            continue
        try:
            found[str(bucket.get("name"))] = ArrivalSettings.model_validate(bucket["arrival"])
        except ValidationError:
            continue
    return found


def level_arrival(key: LevelKey, requests: Sequence[RequestRecord], arrival: ArrivalSettings | None) -> dict[str, Any]:
    """LevelSummary's ``arrival_process``, ``requested_cv`` and ``achieved_cv`` for one level's
    requests (all of them); None for each in a closed-loop level, and Poisson when ``arrival`` is
    None."""
    if key.mode != "open":
        return {"arrival_process": None, "requested_cv": None, "achieved_cv": None}
    arrival = arrival or ArrivalSettings()
    return {
        "arrival_process": arrival.process,
        "requested_cv": requested_cv(arrival.process, arrival.burstiness),
        "achieved_cv": achieved_cv([r.arrival_time for r in requests]),
    }
