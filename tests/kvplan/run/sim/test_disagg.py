"""A disaggregated deployment on the engine's own schedulers (kvplan.run.sim.disagg), checked
against hand arithmetic: a prefill step takes 10 ms, a decode-only step 2 ms, a transfer 1 ms of
setup plus 1 MB at 1 GB/s (1 ms) alone on its link."""

import pytest

from kvplan.results.run_result import EngineFacts
from kvplan.run.driver import Submission
from kvplan.run.sim.cost import ModelClock, StepWork
from kvplan.run.sim.disagg import DisaggBackend
from kvplan.sizing.gpus.links import Link

PREFILL_S, DECODE_S, SETUP_S, MOVE_S = 0.010, 0.002, 0.001, 0.001
LINK = Link("test", bytes_per_s=1e9, setup_s=SETUP_S)
PROMPT = tuple(range(100))  # 100 tokens: 7 blocks of 16


class _Cost:
    gap_s = 0.0

    def step_seconds(self, work: StepWork) -> float:
        return PREFILL_S if work.num_prefill_tokens else DECODE_S


def facts(num_blocks=64, max_num_seqs=8) -> EngineFacts:
    return EngineFacts(
        model="m", device="d", dtype="bf16", kv_cache_dtype="bf16", attention_backend="x", block_size=16,
        num_blocks=num_blocks, bytes_per_block=1, max_model_len=1024, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=1024, enable_prefix_caching=False, seed=0,
    )  # fmt: skip


def run(n_requests, max_tokens=4, prefill=(1, None), decode=(1, None), link=LINK, first_token="prefill"):
    """Every request sent at time 0; (backend, {id: Finished})."""
    clock = lambda: ModelClock(_Cost())  # noqa: E731
    pools = (prefill[1] or facts(), clock, prefill[0]), (decode[1] or facts(), clock, decode[0])
    backend = DisaggBackend(*pools, link, lambda n: 1e6, first_token=first_token)
    for i in range(n_requests):
        backend.submit(Submission(f"L/{i}", PROMPT, max_tokens, 0, "s", arrival_time=0.0))
    done = {}
    while len(done) < n_requests:
        finished, steps = backend.advance(None)
        assert steps == []
        done.update((f.request_id, f) for f in finished)
    for worker in (*backend.prefill, *backend.decode):  # no block leaks on either side
        assert worker.scheduler.block_manager.num_used_blocks == 0
    return backend, done


def test_one_request_ttft_is_the_prefill_step_and_token_2_waits_for_the_transfer():
    _, done = run(1)
    r = done["L/0"]
    assert r.token_times[0] == pytest.approx(PREFILL_S)  # TTFT: the prefill step that sampled token 1
    # token 2: TTFT + transfer (setup + bytes / bandwidth) + the first decode step
    assert r.token_times[1] == pytest.approx(PREFILL_S + SETUP_S + MOVE_S + DECODE_S)
    assert r.token_times[2:] == pytest.approx([0.016, 0.018])
    assert r.kv_transfer_s == pytest.approx(SETUP_S + MOVE_S)
    assert (r.num_output_tokens, r.finish_reason, r.num_prompt_tokens) == (4, "length", 100)


def test_two_transfers_sharing_a_link_take_twice_as_long():
    _, done = run(2)
    for r in done.values():  # both prefilled in one step, both admitted at 10 ms, 0.5 GB/s each
        assert r.kv_transfer_s == pytest.approx(SETUP_S + 2 * MOVE_S)
        assert r.token_times[1] == pytest.approx(PREFILL_S + SETUP_S + 2 * MOVE_S + DECODE_S)


def test_decode_admission_waits_for_a_free_slot():
    _, done = run(2, decode=(1, facts(max_num_seqs=1)))
    first, second = done["L/0"], done["L/1"]
    assert first.token_times == pytest.approx([0.010, 0.014, 0.016, 0.018])
    # the second handoff waits until the first finishes (18 ms): admitted at the step start then,
    # moved by 20 ms, decoded in the steps that start at 20, 22, 24 ms
    assert second.token_times == pytest.approx([0.010, 0.022, 0.024, 0.026])
    assert second.kv_transfer_s == pytest.approx(SETUP_S + MOVE_S)


def test_decode_admission_waits_for_free_blocks_and_the_prefill_worker_holds_them():
    # 10 blocks: a handoff of a 100-token prompt takes ceil(101 / 16) = 7, so the second waits
    backend, done = run(2, decode=(1, facts(num_blocks=10)))
    assert done["L/1"].token_times == pytest.approx([0.010, 0.022, 0.024, 0.026])
    steps = backend.prefill[0].steps
    # the prefill step holds both prompts' 7 blocks each (the engine's own step stats)
    assert len(steps) == 1 and steps[0].num_used_blocks == 14


def test_requests_route_round_robin_and_prefill_in_parallel():
    backend, done = run(4, prefill=(2, None), decode=(2, None))
    assert [len(w.steps) for w in backend.prefill] == [1, 1]  # two requests on each, one step each
    for r in done.values():  # each decode worker gets two handoffs, sharing its own link
        assert r.token_times[0] == pytest.approx(PREFILL_S)
        assert r.kv_transfer_s == pytest.approx(SETUP_S + 2 * MOVE_S)
    assert [sum(s.num_decode_tokens for s in w.steps) for w in backend.decode] == [6, 6]


def test_a_one_token_request_ends_at_the_prefill_worker():
    backend, done = run(1, max_tokens=1)
    assert done["L/0"].token_times == pytest.approx([PREFILL_S]) and done["L/0"].kv_transfer_s is None
    assert backend.decode[0].steps == []


def test_a_handoff_that_can_never_fit_the_decode_pool_ends_as_cannot_fit():
    # a decode pool of 6 blocks (96 tokens) can never take a 100-token prompt + token 1 (7 blocks):
    # it ends when its prefill step ends, its prefill blocks freed; the next request still runs
    backend, done = run(2, decode=(1, facts(num_blocks=6)), max_tokens=2)
    for r in done.values():
        assert (r.finish_reason, r.num_output_tokens) == ("cannot_fit", 1)
        assert r.finish_time == pytest.approx(PREFILL_S) and r.token_times == pytest.approx((PREFILL_S,))
        assert "needs 7 blocks" in r.finish_detail and r.kv_transfer_s is None
    assert backend.decode[0].steps == [] and not backend.decode[0].handoffs


def test_a_handoff_whose_whole_length_can_never_fit_ends_as_cannot_fit_but_one_that_fits_runs():
    # 8 blocks (128 tokens): prompt 100 + 29 max_tokens - 1 = 128 tokens fit; 30 would need 9 blocks
    _, done = run(1, decode=(1, facts(num_blocks=8)), max_tokens=29)
    assert (done["L/0"].finish_reason, done["L/0"].num_output_tokens) == ("length", 29)
    _, done = run(1, decode=(1, facts(num_blocks=8)), max_tokens=30)
    assert (done["L/0"].finish_reason, done["L/0"].num_output_tokens) == ("cannot_fit", 1)
    assert "needs 9 blocks, the decode worker's cache has 8" in done["L/0"].finish_detail


def test_with_token_1_from_decode_the_decode_worker_needs_one_slot_more_and_a_cannot_fit_streams_nothing():
    # the decode worker runs max_tokens + 1 steps' worth: 100 + 29 - 1 = 128 tokens fit 8 blocks, 129 do not
    _, done = run(1, decode=(1, facts(num_blocks=8)), max_tokens=28, first_token="decode")
    assert (done["L/0"].finish_reason, done["L/0"].num_output_tokens) == ("length", 28)
    _, done = run(1, decode=(1, facts(num_blocks=8)), max_tokens=29, first_token="decode")
    r = done["L/0"]
    assert (r.finish_reason, r.num_output_tokens, r.token_times) == ("cannot_fit", 0, ())
    assert r.finish_time == pytest.approx(PREFILL_S) and "needs 9 blocks" in r.finish_detail
