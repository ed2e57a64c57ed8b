"""How ``kvplan plan`` hands its configurations to a pool (kvplan.optimize.plan_pool.chunks): one
GPU kind, tp and dtypes a chunk; on a pool, the heaviest first (by the requests a configuration
can hold in flight), so the last chunks to run are short."""

from types import SimpleNamespace

from kvplan.optimize.plan import Config
from kvplan.optimize.plan_pool import Affinity, chunks, weight


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


def _grid(kinds: dict[str, tuple[int, ...]]) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(config=Config(gpu, tp, "auto", "auto", seqs, 8192))
        for gpu, seqs_of in kinds.items()
        for tp in (1, 2)
        for seqs in seqs_of
    ]


def test_a_pool_worker_keeps_its_gpu_kind_while_it_has_jobs_then_takes_a_free_one():
    # weights: A 2 x (512 + 32) = 1,088; B 2 x (256 + 64) = 640; C 2 x 128 = 256
    jobs = _grid({"A": (32, 512), "B": (64, 256), "C": (128,)})
    work = Affinity(jobs)
    first, second = work.next(None), work.next(None)
    assert first is not None and second is not None
    # each worker starts on its own kind, the most work left first; the heaviest job of it
    assert (first[0], second[0]) == (1, 5)  # A tp 1 seqs 512; B tp 1 seqs 256
    order = [first[0]]
    item = first
    for _ in range(3):  # worker 1 goes on with A's jobs, heaviest first (ties in grid order)
        work.done("A")
        item = work.next("A")
        assert item is not None
        order.append(item[0])
    assert order == [1, 3, 0, 2]
    work.done("A")
    nxt = work.next("A")  # A is spent; B has a worker, C none: C
    assert nxt is not None and nxt[1].config.gpu == "C"
    work.done("B")
    rest = []
    while (got := work.next("B")) is not None:  # the B worker finishes B, then C's last job
        rest.append(got[0])
    assert rest == [7, 4, 6, 9]  # B: 256, 64, 64; then C tp 2 (C tp 1 went to the other worker)
    handed = order + [nxt[0], second[0]] + rest
    assert sorted(handed) == list(range(len(jobs)))


def test_a_pool_judges_every_job_once_and_ranks_as_one_worker_does(monkeypatch):
    from kvplan.optimize import plan_pool

    jobs = _grid({"A": (32, 512), "B": (64, 256), "C": (128,)})
    monkeypatch.setattr(plan_pool, "judge", lambda job: (job.config.gpu, job.config.tp, job.config.max_num_seqs))
    here = plan_pool.run_jobs(jobs, workers=1)
    pooled = plan_pool.run_jobs(jobs, workers=2)
    assert [i for i, _ in here.done] == list(range(len(jobs)))  # one worker: in grid order
    assert sorted(pooled.done) == here.done and not pooled.interrupted
