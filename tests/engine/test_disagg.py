"""The bundled engine disaggregated in one process (engine.disagg): 1 prefill + 1 decode worker give
the aggregated engine's greedy tokens; every exported block arrives; no block leaks after a
completion or a cancel in each phase."""

import pytest

from engine.config import EngineConfig
from engine.disagg.inproc import DisaggEngine
from engine.disagg.kv_blocks import export_blocks, import_blocks
from engine.disagg.workers import worker_engine
from engine.request import SamplingParams
from tests.engine.tiny import TINY, random_prompts, run_to_completion, tiny_engine

SETTINGS = dict(
    model=TINY, dtype="float32", device="cpu", attention_backend="torch", block_size=4, num_blocks=64, max_num_seqs=4
)
LENGTHS = [5, 12, 8, 17, 3, 9]  # prompt tokens: 2, 3, 2, 5, 1, 3 blocks of 4 (the last one partial or not)


def disagg(prefill=1, decode=1, **overrides) -> DisaggEngine:
    config = EngineConfig(**{**SETTINGS, **overrides})
    return DisaggEngine(
        [worker_engine(config, "prefill") for _ in range(prefill)],
        [worker_engine(config, "decode") for _ in range(decode)],
    )


def run(engine: DisaggEngine, prompts, params) -> dict:
    ids = [engine.add_request(p, params) for p in prompts]
    done = {}
    for _ in range(10_000):
        if not engine.has_unfinished():
            break
        done.update((o.request_id, o) for o in engine.step())
    return {i: done[i] for i in ids}


def assert_no_blocks_held(engine: DisaggEngine):
    for w in (*engine.prefill, *engine.decode):
        bm = w.engine.scheduler.block_manager
        assert bm.num_used_blocks == 0, dict(bm.block_tables)
        assert not bm.block_tables
    assert all(not w.scheduler.held for w in engine.prefill)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_disaggregated_greedy_tokens_equal_the_aggregated_engines(prefix_caching):
    prompts = random_prompts(LENGTHS, seed=3)
    prompts.append(prompts[1][:8] + prompts[0])  # shares two full blocks with prompt 1
    params = SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)
    aggregated, _ = run_to_completion(
        tiny_engine(**{**SETTINGS, "enable_prefix_caching": prefix_caching}), prompts, params
    )
    engine = disagg(enable_prefix_caching=prefix_caching)
    outs = run(engine, prompts, params)
    assert [o.output_token_ids for o in outs.values()] == [a.output_token_ids for a in aggregated]
    assert all(len(o.output_token_ids) == 7 and o.finish_reason == "length" for o in outs.values())
    # every block that left the prefill worker arrived: ceil(prompt / 4) blocks each
    num_blocks = sum(-(-len(p) // 4) for p in prompts)
    pw, dw = engine.prefill[0], engine.decode[0]
    per_block = 2 * 2 * 4 * 2 * 16 * 4  # K and V x layers x block_size x KV heads x head_dim x fp32
    assert pw.engine.bytes_per_block == per_block
    assert pw.num_exported_blocks == dw.num_imported_blocks == num_blocks
    assert pw.num_exported_bytes == dw.num_imported_bytes == num_blocks * per_block
    assert dw.num_transfers == len(prompts) and dw.transfer_seconds > 0
    # the decode worker computed no prompt token; the prefill worker no decode token
    assert sum(s.num_prefill_tokens for s in engine.decode_stats[0]) == 0
    assert sum(s.num_decode_tokens for s in engine.prefill_stats[0]) == 0
    assert_no_blocks_held(engine)


def test_two_prefill_and_three_decode_workers_route_round_robin_and_match():
    prompts = random_prompts(LENGTHS, seed=4)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    aggregated, _ = run_to_completion(tiny_engine(**SETTINGS), prompts, params)
    engine = disagg(prefill=2, decode=3)
    outs = run(engine, prompts, params)
    assert [o.output_token_ids for o in outs.values()] == [a.output_token_ids for a in aggregated]
    assert [w.num_transfers for w in engine.decode] == [2, 2, 2]
    assert [w.num_exported_blocks for w in engine.prefill] == [
        sum(-(-n // 4) for n in LENGTHS[0::2]),
        sum(-(-n // 4) for n in LENGTHS[1::2]),
    ]
    assert_no_blocks_held(engine)


def test_one_token_requests_finish_on_the_prefill_worker_and_move_nothing():
    prompts = random_prompts([6, 9], seed=5)
    engine = disagg()
    outs = run(engine, prompts, SamplingParams(temperature=0, max_tokens=1))
    aggregated, _ = run_to_completion(tiny_engine(**SETTINGS), prompts, SamplingParams(temperature=0, max_tokens=1))
    assert [o.output_token_ids for o in outs.values()] == [a.output_token_ids for a in aggregated]
    assert engine.prefill[0].num_exported_blocks == 0 and engine.decode[0].num_transfers == 0
    assert_no_blocks_held(engine)


def test_a_handoff_waits_for_decode_blocks_fifo_and_the_prefill_worker_holds_it():
    # decode pool of 6 blocks: request 0 (12 + 1 tokens: 4 blocks) fits, request 1 (also 4) waits
    config = EngineConfig(**SETTINGS)
    engine = DisaggEngine(
        [worker_engine(config, "prefill")], [worker_engine(EngineConfig(**{**SETTINGS, "num_blocks": 6}), "decode")]
    )
    prompts = random_prompts([12, 12], seed=6)
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)) for p in prompts]
    engine.step()  # both prefilled (24 tokens in one step), both handed off; request 0 admitted
    dw, pw = engine.decode[0], engine.prefill[0]
    assert list(dw.in_transfer) == [ids[0]] and [h.request_id for h in dw.queue] == [ids[1]]
    assert set(pw.scheduler.held) == set(ids) and pw.engine.scheduler.num_used_blocks == 6
    assert dw.engine.scheduler.num_used_blocks == 4
    outs = {}
    while engine.has_unfinished():
        outs.update((o.request_id, o) for o in engine.step())
    aggregated, _ = run_to_completion(
        tiny_engine(**SETTINGS), prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    )
    assert [outs[i].output_token_ids for i in ids] == [a.output_token_ids for a in aggregated]
    assert_no_blocks_held(engine)


@pytest.mark.parametrize("phase", ["prefill", "waiting", "transfer", "decode"])
def test_a_cancel_in_each_phase_frees_every_block_on_both_sides(phase):
    config = EngineConfig(**SETTINGS)
    small = EngineConfig(**{**SETTINGS, "num_blocks": 6})
    engine = DisaggEngine([worker_engine(config, "prefill")], [worker_engine(small, "decode")])
    # 18 + 1 tokens: 5 of the decode pool's 6 blocks (18 + 6 = 24 = its max_model_len: it can run there)
    prompts = random_prompts([12, 12, 18], seed=7)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    # one step prefills all three; 0 admitted (in transfer, 4 blocks), 1 and 2 wait for decode blocks
    engine.step()
    target = {"prefill": None, "waiting": ids[1], "transfer": ids[0], "decode": ids[0]}[phase]
    if phase == "decode":
        engine.step()
        engine.step()
        assert engine.decode[0].engine.scheduler.knows(ids[0])
    if phase == "prefill":
        target = engine.add_request(random_prompts([10], seed=8)[0], params)
        assert engine.abort(target) == "prefill"
    else:
        assert engine.abort(target) == phase
    rest = {}
    for _ in range(1000):
        if not engine.has_unfinished():
            break
        rest.update((o.request_id, o) for o in engine.step())
    assert set(rest) - {target} == set(ids) - {target}
    assert_no_blocks_held(engine)


def test_a_payload_moves_block_contents_exactly_and_a_wrong_size_is_refused():
    a, b = tiny_engine(**SETTINGS), tiny_engine(**SETTINGS)
    for t in (*a.kv_cache.k_caches, *a.kv_cache.v_caches):
        t.copy_(torch_randn_like(t))
    payload = export_blocks(a.kv_cache, [5, 2])
    assert len(payload) == 2 * a.bytes_per_block
    import_blocks(b.kv_cache, [7, 1], payload)
    for src, dst in zip((*a.kv_cache.k_caches, *a.kv_cache.v_caches), (*b.kv_cache.k_caches, *b.kv_cache.v_caches)):
        assert src[5].equal(dst[7]) and src[2].equal(dst[1])
        assert dst[0].abs().sum() == 0  # nothing else written
    with pytest.raises(ValueError, match="payload"):
        import_blocks(b.kv_cache, [1], payload)


def torch_randn_like(t):
    import torch

    return torch.randn(t.shape, generator=torch.Generator().manual_seed(t.numel()), dtype=t.dtype)


def test_a_handoff_the_decode_pool_can_never_hold_ends_as_cannot_fit_not_waiting_forever():
    """Decode pool of 4 blocks of 4 (16 tokens): a 17-token prompt with 4 tokens to generate needs
    blocks for 20 tokens (5 blocks) there, so it ends after its prefill with token 1 and
    cannot_fit; a 5-token prompt behind it still decodes; nothing stays held on either side."""
    big, small = EngineConfig(**SETTINGS), EngineConfig(**{**SETTINGS, "num_blocks": 4, "max_model_len": 64})
    engine = DisaggEngine([worker_engine(big, "prefill")], [worker_engine(small, "decode")])
    long, short = random_prompts([17, 5], seed=7)
    out = run(engine, [long, short], SamplingParams(max_tokens=4, ignore_eos=True))
    refused, served = out["0"], out["1"]
    assert refused.finish_reason == "cannot_fit" and len(refused.output_token_ids) == 1
    assert refused.finish_detail == "needs 5 blocks, the decode worker's cache has 4"
    assert served.finish_reason == "length" and len(served.output_token_ids) == 4
    assert engine.decode[0].num_transfers == 1  # only the short one moved
    assert_no_blocks_held(engine)


def test_a_handoff_past_the_decode_workers_max_model_len_ends_as_cannot_fit():
    small = EngineConfig(**{**SETTINGS, "num_blocks": 8, "max_model_len": 16})
    engine = DisaggEngine([worker_engine(EngineConfig(**SETTINGS), "prefill")], [worker_engine(small, "decode")])
    (out,) = run(engine, random_prompts([12], seed=9), SamplingParams(max_tokens=6, ignore_eos=True)).values()
    assert (
        out.finish_reason == "cannot_fit"
        and out.finish_detail == "prompt 12 + max_tokens 6 = 18 tokens > max_model_len"
    )
    assert_no_blocks_held(engine)
