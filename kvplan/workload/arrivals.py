"""Open-loop arrival processes: when each request of a level arrives, seconds from its start.

A bucket's ``arrival:`` (``Arrival``) picks the process of its open-loop levels
(``request_rates``); at a level of r req/s, ``ArrivalOffsets`` draws the offsets from the level's
seeded generator (kvplan.run.driver), the first arrival at 0:

- ``poisson`` (the default): exponential gaps of mean 1/r s, coefficient of variation (CV) 1;
- ``gamma``: Gamma(shape=B, scale=1/(r*B)) gaps, B = ``burstiness``: mean 1/r s, CV 1/sqrt(B),
  burstier than Poisson for B < 1, more regular for B > 1. This is ``vllm bench serve
  --burstiness`` (vllm/benchmarks/serve.py, ``get_request``: theta = 1 / (request_rate *
  burstiness), ``np.random.gamma(shape=burstiness, scale=theta)``; its newer versions also rescale
  the offsets so that the last lands at num_requests / rate, which kvplan does not: its first
  arrival is at 0 and the gaps are the draws). B = 1 is Poisson in distribution but drawn
  differently: ``poisson`` keeps ``rng.exponential``, so a bucket without ``arrival:`` draws the
  offsets it always has (the gate's baselines depend on them);
- ``constant``: gaps of exactly 1/r s (offset i = i / r, no rounding accumulated), CV 0.

``ramp_up_s`` R > 0: the rate rises linearly from 0 to r over the level's first R seconds, then
stays at r. A time change of the stationary process: each offset s (drawn at the full rate) is
mapped through the inverse of the cumulative intensity Lambda(t) = r t^2 / (2R) for t < R,
r R / 2 + r (t - R) after. With u = r s: t = sqrt(2 R u / r) = sqrt(2 R s) while u < r R / 2
(s < R / 2), else t = R + (u - r R / 2) / r = s + R / 2. About r R / 2 requests arrive during the
ramp; after it, the gaps are the stationary process's.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import numpy as np
from pydantic import Field, ValidationInfo, field_validator

from kvplan.workload.lengths import StrictModel

ArrivalProcess = Literal["poisson", "gamma", "constant"]
PROCESSES: tuple[str, ...] = get_args(ArrivalProcess)
# Gamma's scale 1/(r*B) overflows to inf for a B near 0 (1e-320); 1e-6 is a CV of 1000, far past any real burst
MIN_BURSTINESS = 1e-6
MAX_RAMP_S = 24 * 3600  # a ramp longer than a level may last (kvplan.workload.schema.MAX_LEVEL_S) is a typo


class Arrival(StrictModel):
    """How the requests of a bucket's open-loop levels arrive (``arrival:``): the process, gamma's
    burstiness and a linear ramp-up (kvplan.workload.arrivals); closed-loop levels ignore it."""

    process: ArrivalProcess = Field(
        "poisson",
        description="The arrival process of each open-loop level at r req/s: ``poisson`` (exponential gaps of"
        " mean 1/r s, CV 1), ``gamma`` (Gamma gaps of mean 1/r s, CV 1/sqrt(burstiness), as ``vllm"
        " bench serve --burstiness``) or ``constant`` (gaps of exactly 1/r s, CV 0).",
    )
    burstiness: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="Gamma's shape B (>= 1e-6; for process gamma only, though the default 1 is accepted with any):"
        " gaps Gamma(shape=B, scale=1/(r*B)) s, coefficient of variation 1/sqrt(B); B < 1 is burstier"
        " than Poisson, 1 is Poisson in distribution, B > 1 more regular.",
    )
    ramp_up_s: float = Field(
        0.0,
        ge=0,
        le=MAX_RAMP_S,
        allow_inf_nan=False,
        description="The rate rises linearly from 0 to the level's rate over its first ramp_up_s seconds, s, then"
        " stays (about rate x ramp_up_s / 2 requests arrive during the ramp); 0 = the full rate from"
        " the start.",
    )

    @field_validator("burstiness")
    @classmethod
    def _gamma_only(cls, value: float, info: ValidationInfo) -> float:
        if value < MIN_BURSTINESS:
            raise ValueError(
                f"must be >= {MIN_BURSTINESS:g} (got {value:g}): gamma's scale 1/(rate x burstiness) overflows"
            )
        process = info.data.get("process")  # absent when process itself was refused
        if value != 1.0 and process is not None and process != "gamma":
            raise ValueError(
                f"applies to process gamma only (process is {process}); set process: gamma or drop burstiness"
            )
        return value


def ramped(offset_s: float, ramp_up_s: float) -> float:
    """A stationary arrival offset, s, under a linear ramp-up of ``ramp_up_s`` s (module
    docstring): sqrt(2 R s) for s < R / 2, else s + R / 2; unchanged for R = 0."""
    if ramp_up_s <= 0:
        return offset_s
    half = ramp_up_s / 2
    return math.sqrt(2 * ramp_up_s * offset_s) if offset_s < half else offset_s + half


class ArrivalOffsets:
    """The arrival offsets of one open-loop level at ``rate`` req/s: ``offsets[i]``, request i's,
    seconds from the level's start (the first at 0). Drawn on demand in chunks of ``chunk`` gaps
    from ``rng``, the level's seeded generator; ``arrival``: the bucket's settings, None = poisson."""

    def __init__(self, rng: np.random.Generator, rate: float, chunk: int, arrival: Arrival | None = None):
        self.rng, self.rate, self.chunk = rng, rate, max(chunk, 1)
        self.arrival = arrival if arrival is not None else Arrival()
        self.scale = 1.0 / rate
        self.offsets = np.zeros(0)  # stationary offsets drawn so far (before any ramp-up)

    def _gaps(self) -> np.ndarray:
        if self.arrival.process == "gamma":
            shape = self.arrival.burstiness
            return self.rng.gamma(shape, 1.0 / (self.rate * shape), size=self.chunk)
        return self.rng.exponential(self.scale, size=self.chunk)

    def _stationary(self, index: int) -> float:
        if self.arrival.process == "constant":
            return index / self.rate
        while index >= len(self.offsets):
            gaps = self._gaps()
            last = self.offsets[-1] if len(self.offsets) else None
            more = np.cumsum(gaps[:-1]) if last is None else last + np.cumsum(gaps)
            self.offsets = np.concatenate([self.offsets, [0.0] if last is None else [], more])
        return float(self.offsets[index])

    def __getitem__(self, index: int) -> float:
        return ramped(self._stationary(index), self.arrival.ramp_up_s)
