"""The inter-token latencies of many requests taken by numpy (kvplan.results.stats.latency.itls_s)
are the gaps ``itl_s`` takes one by one, in the same order, so their statistics are the same to
the last bit: random token times, requests with no or one token among them."""

from itertools import chain

from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.results.stats.latency import itl_s, itls_s, latency_stats
from tests.kvplan.results.test_metrics import req

GAPS = st.floats(0.0, 5.0, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 1e6, allow_nan=False), st.lists(GAPS, max_size=40)), max_size=8))
def test_every_gap_in_order_and_the_same_statistics(requests):
    records = []
    for i, (start, gaps) in enumerate(requests):
        times = [start]
        for gap in gaps:
            times.append(times[-1] + gap)
        records.append(req(f"b/closed/4/{i}", start, times))
    one_by_one = list(chain.from_iterable(map(itl_s, records)))
    assert itls_s(records).tolist() == one_by_one
    assert latency_stats(itls_s(records)) == latency_stats(one_by_one)
