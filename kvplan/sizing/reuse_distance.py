"""Reuse distance of a cache's references: exact LRU stack distances, in tokens and seconds, and the
share of reuses an LRU cache of a given size would hit.

A *reference string* is the blocks a stream of requests touches, in order: ``ids[t]`` the block
(any integer key) of reference t, ``weights[t]`` its tokens, ``times[t]`` its request's arrival (s).
A reference t whose block was referenced before, last at p, is a *reuse*, and

- its distance in tokens is the LRU stack distance (Mattson, Gecsei, Slutz and Traiger,
  "Evaluation techniques for storage hierarchies", IBM Systems Journal 9(2), 1970): the tokens of
  the *distinct* blocks other than its own referenced at p+1 .. t-1 (each block's tokens counted
  once however often it was referenced);
- its distance in seconds is ``times[t] - times[p]``.

An LRU cache of C tokens holding whole blocks (the least recently referenced evicted until a new
one fits; a block of more than C tokens empties it and is not kept) holds, at any time, the most
recently referenced blocks whose tokens add up to at most C (a block it evicted has only more
tokens above it since, so never fits again: Mattson's inclusion property, here with blocks of
unequal tokens). So reuse t hits exactly when distance + its block's tokens <= C.

The distances are computed at once, not by walking a stack: with next(s) the reference after s of
s's block, the distinct blocks referenced in (p, t) are the references s in (p, t) with next(s) > t
(each block's last reference in the window), as in Bennett and Kruskal's "LRU stack processing"
(IBM J. Res. Dev. 19(4), 1975). So distance = W(p+1, t) - sum of weights[r] over the reuses r < t
whose previous reference lies after p (W(a, b): the tokens of references a .. b-1), a dominance
sum computed level by level over a merge-sort tree of the reuses (numpy; O(R log^2 R) time and O(N)
memory for N references and R reuses).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# LRU cache sizes (tokens) whose hit share is reported: 4^6 .. 4^12 tokens (4,096 to 16.8 M)
TIER_TOKENS = tuple(4**k for k in range(6, 13))


def previous_reference(ids: np.ndarray) -> np.ndarray:
    """For each reference (``ids`` shape [N], any integer keys), the index of the previous reference
    to the same block, -1 for a first reference. Shape [N], int64."""
    ids = np.asarray(ids)
    prev = np.full(len(ids), -1, dtype=np.int64)
    order = np.argsort(ids, kind="stable")  # equal blocks together, in reference order
    same = ids[order][1:] == ids[order][:-1]
    prev[order[1:][same]] = order[:-1][same]
    return prev


def stack_distances(ids: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reuses of a reference string and their LRU stack distances in tokens (module docstring).

    Args:
        ids: shape [N], each reference's block (integer keys).
        weights: shape [N], each reference's block's tokens (>= 1; a block's references all alike).

    Returns:
        (reuses, distances): the indices of the reuses in reference order (shape [R], int64) and
        their distances in tokens (shape [R], int64).
    """
    weights = np.asarray(weights, dtype=np.int64)
    prev = previous_reference(ids)
    reuses = np.flatnonzero(prev >= 0)
    total = np.concatenate(([0], np.cumsum(weights)))  # W(a, b) = total[b] - total[a]
    p, w = prev[reuses], weights[reuses]
    distances = total[reuses] - total[p + 1] - _earlier_with_later_previous(p, w, len(ids) + 1)
    return reuses, distances


def _earlier_with_later_previous(p: np.ndarray, w: np.ndarray, span: int) -> np.ndarray:
    """For each i, the sum of w[k] over k < i with p[k] > p[i] (shape [R], int64): the prefix [0, i)
    split into one merge-sort-tree block per set bit of i, each block's p sorted (``span`` > max p)."""
    num = len(p)
    out = np.zeros(num, dtype=np.int64)
    index = np.arange(num, dtype=np.int64)
    level = 0
    while (1 << level) < num:
        keys = (index >> level) * span + p
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        summed = np.concatenate(([0], np.cumsum(w[order])))
        ask = np.flatnonzero((index >> level) & 1)
        block = (ask >> level) - 1
        lo = np.searchsorted(sorted_keys, block * span + p[ask], side="right")
        hi = np.searchsorted(sorted_keys, (block + 1) * span, side="left")
        out[ask] += summed[hi] - summed[lo]
        level += 1
    return out


def _quantiles(values: np.ndarray) -> dict[str, float] | None:
    if len(values) == 0:
        return None
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(values.max())}


def reuse_summary(
    ids: np.ndarray, weights: np.ndarray, times: np.ndarray, tier_tokens: tuple[int, ...] = TIER_TOKENS
) -> dict[str, Any]:
    """``kvplan profile``'s ``reuse_distance``: references, reuses, the distances' P50/P90/P99/max
    (numpy's linear interpolation; None without a reuse) in tokens and in seconds, and per LRU cache
    size in ``tier_tokens`` the share of reuses it hits (0 without a reuse). Shapes as
    ``stack_distances``; ``times`` shape [N], seconds."""
    weights = np.asarray(weights, dtype=np.int64)
    reuses, distances = stack_distances(ids, weights)
    prev = previous_reference(ids)[reuses]
    seconds = np.asarray(times, dtype=np.float64)
    gaps = seconds[reuses] - seconds[prev]
    need = distances + weights[reuses]  # the cache's tokens this reuse needs to hit
    shares = [{"tokens": int(c), "hit_share": float((need <= c).mean()) if len(need) else 0.0} for c in tier_tokens]
    return {
        "num_references": int(len(weights)),
        "num_reuses": int(len(reuses)),
        "tokens": _quantiles(distances),
        "seconds": _quantiles(gaps),
        "lru_hits": shares,
    }
