"""A bucket's ``mix``: request classes drawn by weight into one seeded stream of requests.

Production traffic mixes short chats with long documents in one batch; a long prompt's prefill
then delays every short request's next token. A bucket with a ``mix`` samples its
``num_requests`` requests as one stream::

    class of request i   ~ Categorical(weights / sum(weights))    (numpy's Generator.choice)
    request i            = the next request drawn for that class, from the class's own ranges

so every level runs the classes together and the report can give each its own latencies
(kvplan.results.stats.classes). For ``sharegpt`` and ``jsonl`` each class is filled like a bucket of its
own (kvplan.traffic.prompts._select, the same walk over the candidates as every other bucket) and
the classes' picks are dealt to the stream's positions in order; for ``random`` each request's
lengths are drawn from its class's ranges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from kvplan.traffic.requests import SampledRequest
from kvplan.workload.buckets import Bucket

_CLASS_STREAM = 0x6D6978  # "mix": the seed word of the class draws, apart from every other stream


def class_draws(bucket: Bucket, seed: int, bucket_index: int) -> np.ndarray:
    """The class index of each of the bucket's ``num_requests`` requests (ints in [0, classes)),
    drawn by weight from a generator seeded ``[seed, _CLASS_STREAM, bucket_index]``."""
    weights = np.array([c.weight for c in bucket.classes], dtype=np.float64)
    rng = np.random.default_rng([seed, _CLASS_STREAM, bucket_index])
    return rng.choice(len(weights), size=bucket.num_requests, p=weights / weights.sum())


def class_buckets(bucket: Bucket, draws: np.ndarray) -> list[Bucket]:
    """One pseudo-bucket per class of ``bucket`` (its ranges, as many requests as were drawn for
    it; a class drawn 0 times asks for 0), named ``<bucket>/<class>``: what prompt selection fills."""
    counts = np.bincount(draws, minlength=len(bucket.classes))
    return [
        bucket.model_copy(
            update={
                "name": f"{bucket.name}/{c.name}",
                "input_tokens": c.input_tokens,
                "output_tokens": c.output_tokens,
                "mix": None,
                "num_requests": int(n),
            }
        )
        for c, n in zip(bucket.classes, counts)
    ]


def stitch(bucket: Bucket, draws: np.ndarray, per_class: Sequence[Sequence[SampledRequest]]) -> list[SampledRequest]:
    """The bucket's stream: position i takes the next request of class ``draws[i]``, tagged with
    the class's name (``request_class``) and tenant (``tenant_name``)."""
    taken = [iter(requests) for requests in per_class]
    classes = bucket.classes
    return [
        replace(next(taken[c]), request_class=classes[c].name, tenant_name=classes[c].tenant) for c in map(int, draws)
    ]
