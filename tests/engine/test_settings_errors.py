"""Bad engine settings end in one line that starts with the field's name (``<field>: <problem>``),
which kvplan turns into ``engine.<field>: ...``: the device, the attention backend, a KV pool the
machine cannot allocate, a block larger than the model's positions, non-finite sampling numbers
and seeds outside what a torch generator takes."""

from __future__ import annotations

import math

import pytest
import torch

from engine.attention import get_attention_backend
from engine.config import EngineConfig
from engine.request import SamplingParams
from tests.engine.tiny import TINY, random_prompts, tiny_engine


def test_cuda_without_cuda_names_the_device_field(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU torch here; a GPU host too
    with pytest.raises(ValueError, match=r"^device: cuda is not available here \(.+\); use device auto or cpu$"):
        tiny_engine(device="cuda")
    assert tiny_engine(device="auto").device == torch.device("cpu")


def test_triton_on_cpu_without_the_interpreter_names_the_field(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match=r"^attention_backend: triton on CPU needs the Triton interpreter"):
        get_attention_backend("triton", torch.device("cpu"))
    with pytest.raises(RuntimeError, match=r"^attention_backend: "):
        tiny_engine(attention_backend="triton")


# The tiny model in fp32: 2 layers x (K and V) x block_size 4 x 2 KV heads x head_dim 16 x 4 bytes.
TINY_BYTES_PER_BLOCK = 2 * 2 * 4 * 2 * 16 * 4  # 2,048


def test_a_pool_too_large_to_allocate_names_the_field_and_the_bytes():
    # Real allocations, refused at once: 10**12 blocks ask 2.048e15 bytes (16x a 47-bit address
    # space), so no machine or overcommit setting lets them through.
    blocks = 10**12
    with pytest.raises(ValueError) as err:
        tiny_engine(num_blocks=blocks)
    message = str(err.value)
    assert message.startswith("num_blocks: ") and "\n" not in message
    assert f"{blocks * TINY_BYTES_PER_BLOCK:,} bytes" in message  # 2,048,000,000,000,000
    assert message.endswith("; lower num_blocks")

    budget = 2**51  # 2 PiB -> 2**40 blocks of 2,048 bytes
    with pytest.raises(ValueError) as err:
        tiny_engine(num_blocks=None, kv_cache_memory_bytes=budget)
    message = str(err.value)
    assert message.startswith("kv_cache_memory_bytes: ") and f"{2**40 * TINY_BYTES_PER_BLOCK:,} bytes" in message
    assert message.endswith("; lower kv_cache_memory_bytes")


def test_an_allocator_failure_midway_becomes_the_same_line(monkeypatch):
    real_zeros = torch.zeros
    calls = []

    def zeros_failing_on_the_third(*args, **kwargs):  # layer 0 K, layer 1 K, then out of memory
        calls.append(args)
        if len(calls) == 3:
            raise RuntimeError(
                "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
                "can't allocate memory: you tried to allocate 2048 bytes"
            )
        return real_zeros(*args, **kwargs)

    from engine import kv_cache

    monkeypatch.setattr(kv_cache.torch, "zeros", zeros_failing_on_the_third)
    with pytest.raises(ValueError, match=r"^num_blocks: .*5 blocks x 2,048 bytes = 10,240 bytes.*; lower num_blocks$"):
        kv_cache.KVCache(2, 2, 16, 4, torch.float32, torch.device("cpu"), num_blocks=5)


def test_a_block_larger_than_the_model_positions_is_refused():
    # tiny-random-llama has max_position_embeddings 256: a 257-token block could never fill.
    with pytest.raises(
        ValueError,
        match=r"^block_size: must be <= the model's max_position_embeddings 256 "
        r"\(got 1000000000\)",
    ):
        tiny_engine(block_size=10**9, num_blocks=48)
    assert tiny_engine(block_size=256, num_blocks=2).max_model_len == 256


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_temperature_must_be_finite(value):
    with pytest.raises(ValueError, match=r"^temperature: must be a finite number >= 0"):
        SamplingParams(temperature=value)


@pytest.mark.parametrize("value", [math.nan, math.inf, 0.0, 1.5])
def test_top_p_must_be_in_the_unit_interval(value):
    with pytest.raises(ValueError, match=r"^top_p: must be in \(0, 1\]"):
        SamplingParams(top_p=value)


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_seeds_outside_the_generator_range_are_refused(seed):
    with pytest.raises(ValueError, match=r"^seed: must be in \[0, 2\*\*64\)"):
        SamplingParams(seed=seed)
    with pytest.raises(ValueError, match=r"^seed: must be in \[0, 2\*\*64\)"):
        EngineConfig(model=TINY, seed=seed)


def test_the_largest_seed_runs():
    engine = tiny_engine(seed=2**64 - 1)
    params = SamplingParams(max_tokens=3, temperature=1.0, seed=2**64 - 1, ignore_eos=True)
    first, again = engine.generate(random_prompts((5, 5)), params)
    assert len(first.output_token_ids) == 3 and first.output_token_ids == again.output_token_ids


@pytest.mark.parametrize(
    "field, value",
    [("max_tokens", 2.5), ("max_tokens", math.nan), ("max_tokens", True), ("seed", 1.5), ("num_prompt_logits", 1.0)],
)
def test_counts_and_seeds_must_be_ints(field, value):
    # 2.5 used to run 3 tokens, nan never stopped, a float seed broke every later step.
    with pytest.raises(ValueError, match=rf"^{field}: must be an int \(got {value!r}\)"):
        SamplingParams(**{field: value})


def test_a_temperature_below_vllms_epsilon_is_greedy_and_never_stalls_the_engine():
    # logits / 1e-45 overflows fp32 to inf and softmax to nan: every step used to raise.
    assert SamplingParams(temperature=1e-45).greedy and SamplingParams(temperature=9.9e-6).greedy
    assert not SamplingParams(temperature=1e-5).greedy
    prompts = random_prompts((5, 7))
    tiny = SamplingParams(max_tokens=6, temperature=1e-45, ignore_eos=True)
    greedy = SamplingParams(max_tokens=6, ignore_eos=True)
    got = [o.output_token_ids for o in tiny_engine().generate(prompts, tiny)]
    assert got == [o.output_token_ids for o in tiny_engine().generate(prompts, greedy)]
