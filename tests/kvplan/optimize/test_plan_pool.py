"""How ``kvplan plan`` hands its configurations to a pool (kvplan.optimize.plan_pool.chunks): one
GPU kind, tp and dtypes a chunk; on a pool, the heaviest first (by the requests a configuration
can hold in flight), so the last chunks to run are short."""

from types import SimpleNamespace

from kvplan.optimize.plan import Config
from kvplan.optimize.plan_pool import chunks, weight


def _jobs() -> list[SimpleNamespace]:
    configs = [Config("H100-SXM", 1, "auto", "auto", seqs, 8192) for seqs in (64, 256, 128)]
    configs += [
        Config("H200", 2, "auto", "auto", 256, 8192, prefill_workers=1, prefill_tp=1, decode_workers=y, link="nvlink4")
        for y in (1, 4, 2, 4, 1, 2, 1)
    ]
    return [SimpleNamespace(config=c) for c in configs]


def test_a_units_weight_is_its_decode_pools_seqs_in_flight():
    jobs = _jobs()
    assert [weight(j.config) for j in jobs] == [64, 256, 128, 256, 1024, 512, 1024, 256, 512, 256]


def test_in_grid_order_by_default_and_heaviest_first_on_a_pool():
    jobs = _jobs()
    plain = chunks(jobs, size=3)
    assert [[i for i, _ in chunk] for chunk in plain] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    heavy = chunks(jobs, size=3, largest_first=True)
    # the H200 group sorted by weight (ties in grid order): 4, 6 (1,024), 5, 8 (512), 3, 7, 9 (256);
    # chunks of 3 weigh 2,560, 1,024, 256; the H100 chunk 448
    assert [[i for i, _ in chunk] for chunk in heavy] == [[4, 6, 5], [8, 3, 7], [1, 2, 0], [9]]
    assert sorted(i for chunk in heavy for i, _ in chunk) == list(range(len(jobs)))
    for chunk in heavy:  # one GPU kind and tp a chunk, as before
        assert len({(job.config.gpu, job.config.tp) for _, job in chunk}) == 1
