"""engine.models.packed: a bf16 linear with its weight reordered once for oneDNN gives F.linear's
result bit for bit on SmolLM2's shapes, and the engine's greedy tokens do not change with it."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.models import packed
from engine.models.packed import PackedLinear, pack, pack_linears
from engine.request import SamplingParams
from tests.engine.tiny import random_prompts, run_to_completion, tiny_engine

needs_packing = pytest.mark.skipif(
    pack(nn.Linear(8, 8, dtype=torch.bfloat16)) is None, reason="this CPU/torch cannot pack bf16 linears"
)


def smollm2_shapes() -> list[tuple[int, int]]:
    """(out, in) of SmolLM2-135M's linears as engine.models.llama fuses them, from its config.json:
    q/k/v, o, gate/up, down, lm_head."""
    from engine.models.loader import smollm2_folder

    c = json.loads((smollm2_folder() / "config.json").read_text())
    dim, head_dim = c["hidden_size"], c["hidden_size"] // c["num_attention_heads"]
    qkv = (c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * head_dim
    return [
        (qkv, dim),
        (dim, dim),
        (2 * c["intermediate_size"], dim),
        (dim, c["intermediate_size"]),
        (c["vocab_size"], dim),
    ]


@pytest.fixture
def threads():
    """Set torch's threads for one test; restored after."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@needs_packing
@pytest.mark.smollm2
@pytest.mark.parametrize(
    "num_threads, rows",
    [
        (1, (1, 2, 7, 32, 100, 256, 289, 300, 512, 1024)),  # one thread: every row count
        (2, (1, 2, 7, 17, 32, 64, 100, 128, 255, 256)),  # two: decode batches (at 289+ the split differs)
    ],
)
def test_packed_equals_f_linear_bit_for_bit_on_smollm2_shapes(threads, num_threads, rows):
    threads(num_threads)
    g = torch.Generator().manual_seed(0)
    assert smollm2_shapes() == [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]
    for out_features, in_features in smollm2_shapes():
        linear = nn.Linear(
            in_features, out_features, bias=out_features == 960, dtype=torch.bfloat16
        )  # qkv: Qwen2's bias
        with torch.no_grad():
            linear.weight.copy_(torch.randn(out_features, in_features, generator=g) * in_features**-0.5)
            if linear.bias is not None:
                linear.bias.copy_(torch.randn(out_features, generator=g))
        p = pack(linear)
        assert isinstance(p, PackedLinear)
        for n in rows:
            x = torch.randn(n, in_features, generator=g).to(torch.bfloat16)
            with torch.inference_mode():
                assert torch.equal(p(x), F.linear(x, linear.weight, linear.bias)), (out_features, in_features, n)


def test_only_bf16_cpu_weights_are_packed(monkeypatch):
    assert pack(nn.Linear(8, 8)) is None  # fp32 stays nn.Linear
    monkeypatch.setattr(packed, "packing_available", lambda: False)
    assert pack(nn.Linear(8, 8, dtype=torch.bfloat16)) is None


@needs_packing
def test_a_packed_product_that_differs_from_f_linear_is_not_used(monkeypatch):
    monkeypatch.setattr(packed.F, "linear", lambda x, w, b=None: torch.zeros(x.shape[0], w.shape[0]))
    model = nn.Sequential(nn.Linear(8, 8, dtype=torch.bfloat16))
    assert pack_linears(model) == 0 and isinstance(model[0], nn.Linear)


def greedy_ids(monkeypatch, pack_them: bool, **settings) -> tuple[list[list[int]], int]:
    """Tiny bf16 engine's greedy ids for six prompts, and how many PackedLinears it has."""
    with monkeypatch.context() as m:
        if not pack_them:
            m.setattr(packed, "packing_available", lambda: False)
        engine = tiny_engine(dtype="bfloat16", **settings)
    outputs, _ = run_to_completion(
        engine, random_prompts((5, 13, 2, 30, 9, 17)), SamplingParams(max_tokens=16, ignore_eos=True)
    )
    return [list(o.output_token_ids) for o in outputs], sum(isinstance(m, PackedLinear) for m in engine.model.modules())


@needs_packing
@pytest.mark.parametrize("settings", [{}, {"max_num_batched_tokens": 7}], ids=["batch", "chunked"])
def test_engine_greedy_tokens_equal_with_and_without_packing(monkeypatch, settings):
    packed_ids, count = greedy_ids(monkeypatch, True, **settings)
    plain_ids, none = greedy_ids(monkeypatch, False, **settings)
    assert (count, none) == (2 * 4 + 1, 0)  # per layer wqkv, wo, w13, w2; then the lm_head
    assert packed_ids == plain_ids
    assert not any(isinstance(m, PackedLinear) for m in tiny_engine().model.modules())  # fp32: none


@needs_packing
@pytest.mark.smollm2
def test_smollm2_bf16_greedy_tokens_equal_with_and_without_packing(monkeypatch):
    from engine.config import DEFAULT_MODEL, EngineConfig
    from engine.llm_engine import LLMEngine

    def run(pack_them: bool) -> list[list[int]]:
        with monkeypatch.context() as m:
            if not pack_them:
                m.setattr(packed, "packing_available", lambda: False)
            engine = LLMEngine(
                EngineConfig(
                    model=DEFAULT_MODEL, dtype="bfloat16", block_size=16, num_blocks=256, max_num_batched_tokens=256
                )
            )
        assert sum(isinstance(m, PackedLinear) for m in engine.model.modules()) == (121 if pack_them else 0)
        prompts = random_prompts((40, 90, 7, 150, 61, 120, 33, 200), seed=3, vocab=49152)
        outputs, _ = run_to_completion(engine, prompts, SamplingParams(max_tokens=24, ignore_eos=True))
        return [list(o.output_token_ids) for o in outputs]

    assert run(True) == run(False)


# ---- UpcastLinear: bf16 layers computed in fp32 where bf16 matrix multiplies are emulated ----------


@pytest.fixture
def emulated(monkeypatch):
    """Make this CPU look like one without oneDNN bf16 kernels (as AVX2-only CPUs are)."""
    monkeypatch.setattr(packed, "packing_available", lambda: False)
    monkeypatch.setattr(packed, "bf16_matmul_emulated", lambda: True)


def test_upcast_linear_is_exact_where_every_sum_is_exact(emulated):
    # Small integers: every product and sum is exact in fp32 and the result fits bf16's 8 bits,
    # so the answer is the integer product, computed here in int64.
    g = torch.Generator().manual_seed(0)
    linear = nn.Linear(16, 24, dtype=torch.bfloat16)
    w = torch.randint(-2, 3, (24, 16), generator=g)
    b = torch.randint(-8, 9, (24,), generator=g)
    with torch.no_grad():
        linear.weight.copy_(w)
        linear.bias.copy_(b)
    up = packed.upcast(linear)
    assert isinstance(up, packed.UpcastLinear)
    x = torch.randint(-2, 3, (5, 16), generator=g)
    y = up(x.to(torch.bfloat16))
    assert y.dtype == torch.bfloat16
    assert torch.equal(y.long(), x @ w.T + b)


def test_upcast_applies_only_to_bf16_cpu_weights_where_bf16_is_emulated(monkeypatch, emulated):
    assert packed.upcast(nn.Linear(8, 8)) is None  # fp32 stays nn.Linear
    model = nn.Sequential(nn.Linear(8, 8, dtype=torch.bfloat16), nn.Linear(8, 4, bias=False, dtype=torch.bfloat16))
    assert pack_linears(model) == 2 and all(isinstance(m, packed.UpcastLinear) for m in model)
    assert model[0].weight.dtype == model[0].bias.dtype == torch.float32 and model[1].bias is None
    monkeypatch.setattr(packed, "bf16_matmul_emulated", lambda: False)
    assert packed.upcast(nn.Linear(8, 8, dtype=torch.bfloat16)) is None


@pytest.mark.smollm2
def test_upcast_rounds_the_exact_product_to_a_neighbouring_bf16_on_smollm2_shapes(emulated):
    # The fp64 product is the reference. fp32 accumulation may move a sum by ~1e-6 of sum |x||w|
    # before the one rounding to bf16 (whose step at |v| is 2^(floor(log2|v|) - 7)); F.linear's
    # bf16 path does the same in another order, so the two differ on few elements.
    g = torch.Generator().manual_seed(0)
    for out_features, in_features in smollm2_shapes():
        linear = nn.Linear(in_features, out_features, bias=out_features == 960, dtype=torch.bfloat16)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(out_features, in_features, generator=g) * in_features**-0.5)
        up = packed.upcast(linear)
        assert up is not None
        w = linear.weight.double()
        b = linear.bias.double() if linear.bias is not None else torch.zeros(out_features, dtype=torch.float64)
        for n in (1, 7, 32):
            x = torch.randn(n, in_features, generator=g).to(torch.bfloat16)
            with torch.inference_mode():
                ours, theirs = up(x), F.linear(x, linear.weight, linear.bias)
            exact = x.double() @ w.T + b
            step = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - 7)
            slack = 1e-6 * (x.double().abs() @ w.abs().T + b.abs())
            assert ((ours.double() - exact).abs() <= step + slack).all(), (out_features, in_features, n)
            assert (ours != theirs).float().mean() < 1e-2  # measured: at most 1 element of 576


@pytest.mark.parametrize("settings", [{}, {"max_num_batched_tokens": 7}], ids=["batch", "chunked"])
def test_engine_greedy_tokens_equal_with_and_without_upcast(monkeypatch, settings):
    def run(emulate: bool) -> tuple[list[list[int]], int]:
        with monkeypatch.context() as m:
            m.setattr(packed, "packing_available", lambda: False)
            m.setattr(packed, "bf16_matmul_emulated", lambda: emulate)
            engine = tiny_engine(dtype="bfloat16", **settings)
        outputs, _ = run_to_completion(
            engine, random_prompts((5, 13, 2, 30, 9, 17)), SamplingParams(max_tokens=16, ignore_eos=True)
        )
        ids = [list(o.output_token_ids) for o in outputs]
        return ids, sum(isinstance(m, packed.UpcastLinear) for m in engine.model.modules())

    (up_ids, count), (plain_ids, none) = run(True), run(False)
    assert (count, none) == (2 * 4 + 1, 0)  # per layer wqkv, wo, w13, w2; then the lm_head
    assert up_ids == plain_ids
