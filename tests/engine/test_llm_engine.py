"""LLMEngine on the tiny random Llama: greedy ids equal transformers' generate in fp32 through
batching, chunked prefill and preemption; abort, cannot_fit and oom finish requests and free
their blocks; StepStats count what ran."""

from __future__ import annotations

import pytest
import torch

from engine.request import FinishReason, SamplingParams
from tests.engine.tiny import hf_greedy, random_prompts, run_to_completion, tiny_engine, tiny_hf_model

# Lengths chosen off block boundaries (block_size 4): partial last blocks everywhere.
LENGTHS = (5, 13, 2, 30, 9, 17)
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    hf = tiny_hf_model()
    return [hf_greedy(hf, p, MAX_TOKENS, ignore_eos=True) for p in random_prompts(LENGTHS)]


def greedy() -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


def test_batch_greedy_equals_transformers(reference):
    outputs, stats = run_to_completion(tiny_engine(), random_prompts(LENGTHS), greedy())
    assert [list(o.output_token_ids) for o in outputs] == reference
    assert all(o.finish_reason == FinishReason.LENGTH for o in outputs)
    # Step 0 prefills all six prompts at once (76 tokens < budget 2048); then one decode each.
    assert (stats[0].num_prefill_tokens, stats[0].num_decode_tokens) == (sum(LENGTHS), 0)
    assert (stats[1].num_prefill_tokens, stats[1].num_decode_tokens) == (0, len(LENGTHS))
    assert len(stats) == MAX_TOKENS
    assert all(s.num_used_blocks + s.num_free_blocks == s.num_total_blocks == 128 for s in stats)
    assert stats[-1].num_used_blocks == 0


def test_chunked_prefill_greedy_equals_transformers(reference):
    # Budget 8 tokens per step: the 30-token prompt is prefilled over several steps.
    engine = tiny_engine(max_num_batched_tokens=8)
    outputs, stats = run_to_completion(engine, random_prompts(LENGTHS), greedy())
    assert [list(o.output_token_ids) for o in outputs] == reference
    assert all(s.num_prefill_tokens + s.num_decode_tokens <= 8 for s in stats)
    assert any(0 < s.num_prefill_tokens and s.num_decode_tokens > 0 for s in stats)  # mixed steps


def test_preemption_keeps_greedy_equal_to_transformers(reference):
    # The 30-token request alone needs ceil(41 / 4) = 11 blocks; 16 blocks cannot hold all six.
    engine = tiny_engine(num_blocks=16)
    outputs, stats = run_to_completion(engine, random_prompts(LENGTHS), greedy())
    assert sum(s.num_preemptions for s in stats) > 0
    assert sum(o.num_preemptions for o in outputs) > 0
    assert [list(o.output_token_ids) for o in outputs] == reference


@pytest.mark.triton
def test_triton_backend_greedy_equals_transformers(reference):
    # Kept tiny: the Triton interpreter costs milliseconds per program iteration.
    prompts = random_prompts(LENGTHS)[:3]
    engine = tiny_engine(attention_backend="triton", max_num_batched_tokens=8)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    outputs, _ = run_to_completion(engine, prompts, params)
    assert engine.attention_backend == "triton"
    assert [list(o.output_token_ids) for o in outputs] == [r[:4] for r in reference[:3]]


def test_timestamps_and_text_fields():
    engine = tiny_engine()
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    outputs, _ = run_to_completion(engine, random_prompts((7, 3)), params)
    for o in outputs:
        assert o.text is None  # the tiny model has no tokenizer
        assert len(o.token_times) == 3
        assert o.arrival_time <= o.first_scheduled_time <= o.token_times[0]
        assert o.token_times[0] <= o.token_times[-1] == o.finish_time


def test_stops_at_eos_unless_ignored():
    # Prompt seed 10 makes the tiny model emit EOS (id 2) as its 17th greedy token.
    prompt = random_prompts((7,), seed=10)[0]
    hf_ids = hf_greedy(tiny_hf_model(), prompt, 30)
    assert hf_ids[-1] == 2 and len(hf_ids) < 30
    engine = tiny_engine()
    stopped = engine.generate([prompt], SamplingParams(max_tokens=30))[0]
    assert list(stopped.output_token_ids) == hf_ids and stopped.finish_reason == FinishReason.STOP
    ignored = engine.generate([prompt], SamplingParams(max_tokens=30, ignore_eos=True))[0]
    assert len(ignored.output_token_ids) == 30 and ignored.output_token_ids[: len(hf_ids)] == tuple(hf_ids)


def test_forced_tokens_are_emitted_and_then_greedy_continues_from_them():
    # a replayed reply: the forced ids come out first, and the greedy tokens after them are the
    # model's continuation of prompt + forced ids (transformers' greedy decode as the reference)
    prompt = random_prompts((7,), seed=3)[0]
    forced = (5, 17, 300, 2)  # 2 is EOS: forced, it does not stop a request that ignores EOS
    out = tiny_engine().generate([prompt], SamplingParams(max_tokens=9, ignore_eos=True, forced_token_ids=forced))[0]
    assert out.output_token_ids[:4] == forced and len(out.output_token_ids) == 9
    assert list(out.output_token_ids[4:]) == hf_greedy(tiny_hf_model(), [*prompt, *forced], 5, ignore_eos=True)
    with pytest.raises(ValueError, match="forced_token_ids: must be a tuple of ints"):
        SamplingParams(forced_token_ids=[1, 2])  # type: ignore[arg-type]  # the wrong type is the point


def test_abort_frees_blocks_and_reports_abort():
    engine = tiny_engine()
    a = engine.add_request(random_prompts((9,))[0], SamplingParams(max_tokens=50, ignore_eos=True))
    b = engine.add_request(random_prompts((6,), seed=2)[0], SamplingParams(max_tokens=50, ignore_eos=True))
    _, stats = engine.step()
    assert stats.num_used_blocks == 3 + 2  # ceil(9/4) + ceil(6/4)
    engine.abort(a)
    outputs, stats = engine.step()
    assert [(o.request_id, o.finish_reason) for o in outputs] == [(a, FinishReason.ABORT)]
    assert len(outputs[0].output_token_ids) == 1  # the token sampled at prefill
    assert stats.num_running == 1 and stats.num_used_blocks == 2  # b: 7 tokens in 2 blocks
    engine.abort(b)
    engine.abort("never-added")  # ignored
    outputs, stats = engine.step()
    assert [o.request_id for o in outputs] == [b] and stats.num_used_blocks == 0
    assert not engine.has_unfinished()


def test_has_unfinished_until_every_output_is_returned():
    engine = tiny_engine(num_blocks=8)
    too_long = engine.add_request(random_prompts((30,))[0], SamplingParams(max_tokens=10))  # cannot fit
    waiting = engine.add_request(random_prompts((5,))[0], SamplingParams(max_tokens=3))
    engine.abort(waiting)
    seen = []
    while engine.has_unfinished():  # both finished already, but their outputs are still to come
        seen += [(o.request_id, o.finish_reason) for o in engine.step()[0]]
    assert seen == [(too_long, FinishReason.CANNOT_FIT), (waiting, FinishReason.ABORT)]


def test_engine_chosen_ids_skip_the_ids_callers_chose():
    engine = tiny_engine()
    prompt = random_prompts((5,))[0]
    assert engine.add_request(prompt, SamplingParams(), request_id="1") == "1"
    assert [engine.add_request(prompt, SamplingParams()) for _ in range(2)] == ["0", "2"]
    with pytest.raises(ValueError, match="request_id: '1' is already in use"):
        engine.add_request(prompt, SamplingParams(), request_id="1")


def test_cannot_fit_finishes_at_once_with_the_numbers():
    engine = tiny_engine(num_blocks=8)  # 8 blocks x 4 = 32 tokens; max_model_len = min(256, 32)
    assert engine.max_model_len == 32
    rid = engine.add_request(random_prompts((30,))[0], SamplingParams(max_tokens=10))
    outputs, stats = engine.step()
    assert outputs[0].request_id == rid and outputs[0].finish_reason == FinishReason.CANNOT_FIT
    assert "40" in outputs[0].finish_detail and "32" in outputs[0].finish_detail
    assert outputs[0].output_token_ids == () and stats.num_used_blocks == 0


def test_oom_in_a_step_finishes_its_requests_and_the_engine_goes_on(monkeypatch):
    engine = tiny_engine()
    prompts = random_prompts((5, 7, 6))
    first = [engine.add_request(p, SamplingParams(max_tokens=4, ignore_eos=True)) for p in prompts[:2]]
    real_execute = engine.runner.execute

    def failing_execute(output):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 123 bytes"
        )

    monkeypatch.setattr(engine.runner, "execute", failing_execute)
    outputs, stats = engine.step()
    assert sorted(o.request_id for o in outputs) == sorted(first)
    assert {o.finish_reason for o in outputs} == {FinishReason.OOM}
    assert "can't allocate memory" in outputs[0].finish_detail
    assert stats.num_oom == 2 and stats.num_used_blocks == 0 and stats.num_running == 0

    monkeypatch.setattr(engine.runner, "execute", real_execute)
    later = engine.generate([prompts[2]], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert later.finish_reason == FinishReason.LENGTH
    assert list(later.output_token_ids) == hf_greedy(tiny_hf_model(), prompts[2], 4, ignore_eos=True)


def test_other_runtime_errors_propagate(monkeypatch):
    engine = tiny_engine()
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=2))

    def broken(output):
        raise RuntimeError("shape bug")

    monkeypatch.setattr(engine.runner, "execute", broken)
    with pytest.raises(RuntimeError, match="shape bug"):
        engine.step()


def test_seeded_sampling_does_not_depend_on_batch_mates():
    params = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    prompt = random_prompts((6,))[0]
    alone = tiny_engine().generate([prompt], params)[0]
    others = SamplingParams(max_tokens=5, temperature=0.7, ignore_eos=True)
    engine = tiny_engine()
    engine.add_request(random_prompts((11,), seed=3)[0], others)
    crowded = engine.generate([random_prompts((4,), seed=4)[0], prompt], [others, params])[1]
    assert crowded.output_token_ids == alone.output_token_ids
    greedy_ids = tiny_engine().generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert alone.output_token_ids != greedy_ids.output_token_ids  # it really sampled


def test_bytes_per_block_from_the_real_tensors():
    # 2 layers x (K and V) x block_size 16 x 2 KV heads x head_dim 16 x element size.
    assert tiny_engine(block_size=16, num_blocks=4).bytes_per_block == 2 * 2 * 16 * 2 * 16 * 4
    bf16 = tiny_engine(block_size=16, num_blocks=4, dtype="bfloat16")
    assert bf16.bytes_per_block == 4096 and bf16.dtype == bf16.kv_cache_dtype == torch.bfloat16
    fp8 = tiny_engine(
        block_size=16, dtype="bfloat16", num_blocks=None, kv_cache_memory_bytes=10_000, kv_cache_dtype="fp8"
    )
    assert fp8.bytes_per_block == 2048 and fp8.num_blocks == 4  # floor(10,000 / 2,048)
    assert fp8.kv_cache_dtype == torch.float8_e4m3fn


def test_bad_input_is_one_clear_error():
    engine = tiny_engine()
    with pytest.raises(ValueError, match=r"prompt_token_ids: every id must be in \[0, 512\)"):
        engine.add_request([1, 512], SamplingParams())
    with pytest.raises(ValueError, match="prompt_token_ids"):
        engine.add_request([], SamplingParams())
    with pytest.raises(ValueError, match="has no tokenizer"):
        engine.generate(["hello"], SamplingParams())
    with pytest.raises(ValueError, match="max_model_len: must be <= the model's max_position_embeddings 256"):
        tiny_engine(max_model_len=300)


def test_one_token_requests_show_the_blocks_they_held_during_the_step():
    """Requests that finish in the step that admits them free their blocks before the step's
    stats are read: num_used_blocks is 0 after every step, but the blocks were held while the
    step ran. Prompts of 5, 13 and 9 tokens in blocks of 4: 2 + 4 + 3 = 9 blocks, one token each."""
    lengths = (5, 13, 9)
    one_token = SamplingParams(max_tokens=1, ignore_eos=True)
    outputs, stats = run_to_completion(tiny_engine(), random_prompts(lengths), one_token)
    assert [len(o.output_token_ids) for o in outputs] == [1, 1, 1]
    assert len(stats) == 1 and stats[0].num_finished == 3
    assert stats[0].num_used_blocks == 0  # after the step
    assert stats[0].num_peak_used_blocks == sum(-(-n // 4) for n in lengths) == 9  # during it


def test_peak_blocks_are_never_below_the_after_step_count(reference):
    _, stats = run_to_completion(tiny_engine(), random_prompts(LENGTHS), greedy())
    assert all(s.num_peak_used_blocks >= s.num_used_blocks for s in stats)
    # step 0 prefills all six prompts: ceil(n / 4) blocks each, 2+4+1+8+3+5 = 23 held
    assert stats[0].num_peak_used_blocks == sum(-(-n // 4) for n in LENGTHS) == 23
    # the last step finishes everything: blocks held during it, none after
    assert stats[-1].num_used_blocks == 0 and stats[-1].num_peak_used_blocks > 0
