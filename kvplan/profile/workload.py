"""A workload YAML that reproduces a profiled log's traffic (``kvplan profile LOG --out W.yaml``).

From a kvplan.profile.stats.TrafficProfile:

- ``engine``: ``model`` as asked, the profile's ``block_size``, prefix caching on;
- ``dataset``: ``random`` (token ids from the engine's vocab, lengths drawn as below) or ``sharegpt``
  (real prompts filtered by the ranges; kvplan.profile.sharegpt refuses ranges ShareGPT
  cannot fill);
- one bucket ``traffic``, its lengths a ``mix`` of up to three classes split at the P50 and P90 of
  the requests' own input lengths (the prompt less its shared prefix when ``shared_prefix`` is
  written): ``short`` (<= P50), ``medium`` (<= P90), ``long``; weights = their shares of the
  requests; each class's ``input_tokens``/``output_tokens`` range from its requests' min to max,
  ``dist`` the one of uniform, normal, lognormal (with their mean and std) nearest their quantiles
  (random only; ``fixed`` where all are equal);
- ``request_rates: [the log's rate]`` with ``arrival`` gamma of ``burstiness`` = the fitted gamma
  shape when the gaps' CV differs from 1 by more than ``CV_TOLERANCE``, else poisson (constant for
  CV 0); ``num_requests`` = the log's requests (or sessions);
- ``shared_prefix`` when prompts share prefixes: ``num_tokens`` = the median shared prefix of the
  requests carrying one, whole blocks; ``fraction`` = the share of requests whose shared prefix is at
  least that long; ``num_prefixes`` = the distinct prefixes of that length among them
  (PrefixStats.typical_prefix);
- with multi-turn sessions (turns mean > 1, session ids): ``dataset.sessions`` instead of the mix
  and the prefix (sessions refuse both): ``max_turns`` = the rounded mean turns, ``think_time_s`` =
  [P10, P90] of the gaps between a turn's finish (else arrival) and the next turn's arrival, each
  turn's ``input_tokens`` its new message (prompt less the previous turn's prompt and reply);
  every session counts, one of one turn too: in ``num_requests``, the rate of session starts and
  the turns' lengths.

The result is validated by the workload schema (kvplan.workload.file.parse_workload) before
it is written, so ``kvplan simulate`` and ``kvplan loadtest`` read it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import yaml

from kvplan.errors import KvplanError
from kvplan.profile.stats import TrafficProfile, arrival_stats
from kvplan.workload.file import parse_workload
from kvplan.workload.schema import Workload

CV_TOLERANCE = 0.15  # |CV - 1| above this: gamma arrivals, else Poisson
CLASS_QUANTILES = (50, 90)  # the input-length percentiles the classes are split at
CLASS_NAMES = ("short", "medium", "long")
FIT_QUANTILES = np.arange(0.05, 0.951, 0.05)
_Z = np.asarray([NormalDist().inv_cdf(q) for q in FIT_QUANTILES])


def _quantiles(dist: str, lo: int, hi: int, mean: float, std: float) -> np.ndarray:
    """The ``FIT_QUANTILES`` of kvplan's draws of ``dist`` clipped to [lo, hi] (kvplan.traffic.prompts.draw_lengths):
    clipping moves no quantile inside the range, so they are the distribution's, clipped."""
    if dist == "uniform":
        raw = lo + (hi - lo) * FIT_QUANTILES
    elif dist == "normal":
        raw = mean + std * _Z
    else:
        sigma2 = math.log1p((std / mean) ** 2)
        raw = np.exp(math.log(mean) - sigma2 / 2 + math.sqrt(sigma2) * _Z)
    return np.clip(raw, lo, hi)


def lengths(values: np.ndarray, dataset: str) -> dict[str, Any] | int:
    """A ``Lengths`` mapping for ``values`` (tokens >= 1): ``fixed`` when all are equal, else
    [min, max] and, for random, the distribution of uniform, normal (the values' mean and std) and
    lognormal (fitted to the mean and std of the values' logarithms, written as the mean and std of
    the lengths) whose quantiles 5%, 10%, ..., 95% lie nearest the values' (mean absolute error)."""
    values = np.maximum(values, 1)
    lo, hi = int(values.min()), int(values.max())
    if lo == hi:
        return lo
    out: dict[str, Any] = {"min": lo, "max": hi}
    if dataset != "random" or values.std() == 0:
        return out
    logs = np.log(values)
    mu, sigma = float(logs.mean()), float(logs.std())
    log_mean = math.exp(mu + sigma**2 / 2)  # the lognormal fitted to the log-lengths' moments
    fits = {
        "uniform": (float(values.mean()), float(values.std())),
        "normal": (float(values.mean()), float(values.std())),
        "lognormal": (log_mean, log_mean * math.sqrt(math.expm1(sigma**2))),
    }
    seen = np.percentile(values, 100 * FIT_QUANTILES)
    errors = {
        d: float(np.abs(_quantiles(d, lo, hi, *fit) - seen).mean()) for d, fit in fits.items() if lo <= fit[0] <= hi
    }
    best = min(errors, key=lambda d: errors[d])
    if best != "uniform":
        out.update(dist=best, mean=round(fits[best][0], 3), std=round(fits[best][1], 3))
    return out


def _classes(own_inputs: np.ndarray, outputs: np.ndarray, dataset: str) -> list[dict[str, Any]]:
    cuts = np.percentile(own_inputs, CLASS_QUANTILES)
    labels = np.searchsorted(cuts, own_inputs, side="left")  # <= P50: 0, <= P90: 1, else 2
    classes = []
    for c, name in enumerate(CLASS_NAMES):
        members = labels == c
        if members.any():
            classes.append(
                {
                    "name": name,
                    "weight": round(float(members.mean()), 6),
                    "input_tokens": lengths(own_inputs[members], dataset),
                    "output_tokens": lengths(outputs[members], dataset),
                }
            )
    return classes


def _arrival(cv: float | None, shape: float | None) -> dict[str, Any]:
    if cv is None or abs(cv - 1.0) <= CV_TOLERANCE:
        return {"process": "poisson"}
    if shape is None:  # CV 0: evenly spaced
        return {"process": "constant"}
    return {"process": "gamma", "burstiness": round(shape, 4)}


def _session_inputs(profile: TrafficProfile) -> np.ndarray:
    """Each session turn's new message: its prompt less the previous turn's prompt and reply (the
    prompt itself where that is not positive)."""
    new = []
    for group in profile.sessions:
        for k, i in enumerate(group):
            prev = group[k - 1] if k else None
            grown = (
                0
                if prev is None
                else profile.input_tokens[i] - profile.input_tokens[prev] - profile.output_tokens[prev]
            )
            new.append(int(grown) if grown > 0 else int(profile.input_tokens[i]))
    return np.asarray(new, dtype=np.int64)


def workload_from_profile(
    profile: TrafficProfile,
    *,
    model: str,
    dataset: str = "random",
    name: str = "profiled",
    seed: int = 0,
    num_requests: int | None = None,
) -> dict[str, Any]:
    """The workload mapping (see the module docstring); ``num_requests`` None: the log's count."""
    data = profile.data
    block_size = data["block_size"]
    engine = {"model": model, "block_size": block_size, "enable_prefix_caching": True}
    bucket: dict[str, Any] = {"name": "traffic"}
    workload: dict[str, Any] = {"name": name, "seed": seed, "engine": engine, "dataset": dataset, "buckets": [bucket]}
    turns = data["turns"]
    if profile.sessions and turns is not None and turns["mean"] > 1:
        first = np.asarray([g[0] for g in profile.sessions])
        turn_inputs = _session_inputs(profile)
        turn_outputs = profile.output_tokens[[i for g in profile.sessions for i in g]]
        think = profile.think_times_s
        window = [round(float(np.percentile(think, 10)), 3), round(float(np.percentile(think, 90)), 3)]
        workload["dataset"] = {
            "kind": dataset,
            "sessions": {"max_turns": max(2, round(turns["mean"])), "think_time_s": window if len(think) else 0.0},
        }
        bucket.update(
            input_tokens=lengths(turn_inputs, dataset),
            output_tokens=lengths(turn_outputs, dataset),
        )
        arrivals, count = profile.arrivals_s[first], len(first)
    else:
        prefix = data["shared_prefix"]
        own = profile.input_tokens.copy()
        if data["prefix_reuse"] > 0 and prefix["num_tokens"] >= block_size:
            carriers = profile.prefix.shared_tokens >= prefix["num_tokens"]
            own[carriers] -= np.minimum(prefix["num_tokens"], own[carriers] - 1)
            workload["shared_prefix"] = {
                "num_tokens": prefix["num_tokens"],
                "num_prefixes": max(1, prefix["num_prefixes"]),
                "fraction": round(prefix["fraction"], 6),
            }
        bucket["mix"] = _classes(own, profile.output_tokens, dataset)
        arrivals, count = profile.arrivals_s, len(profile.arrivals_s)
    arrival = arrival_stats(arrivals)
    if arrival["rate_per_s"]:
        bucket.update(
            request_rates=[round(arrival["rate_per_s"], 6)], arrival=_arrival(arrival["cv"], arrival["gamma_shape"])
        )
    else:  # one request (or all at one instant): a closed loop of the requests in flight
        bucket["concurrency"] = [max(1, min(count, data["peak_in_flight"] or count))]
    bucket["num_requests"] = num_requests or count
    return workload


def workload_name(log: str | Path) -> str:
    """A workload name from the log's file name: its stem, characters outside ``[A-Za-z0-9_.-]`` as ``-``."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(log).stem)[:200]
    return stem or "profiled"


def write_workload(data: dict[str, Any], path: str | Path, log: str) -> Workload:
    """Validate ``data`` with the workload schema, then write it as YAML to ``path``.

    Raises:
        KvplanError: the workload the profile gives is invalid (named as the log's, the workload's
        field after ``out:``: the log's traffic is beyond what a workload holds, such as a think time
        over 24 h), or ``path`` cannot be written.
    """
    try:
        workload = parse_workload(data, source=str(path))
    except KvplanError as err:  # the fault is the log's (its times, its lengths), not the file not yet written
        fix = "check the log's times (one clock, seconds) and lengths, or profile it without --out"
        raise KvplanError(f"out: {err.field}", err.problem, fix, source=log) from None
    text = f"# kvplan profile {log}: a workload reproducing the log's traffic (docs/profile.md)\n"
    text += yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as err:
        raise KvplanError("out", f"cannot write {path} ({err.strerror or err})") from None
    return workload
