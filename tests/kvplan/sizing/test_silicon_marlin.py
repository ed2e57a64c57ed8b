"""MXFP4 experts on Marlin (kvplan.sizing.gpus.silicon_marlin): the carrying rule by hand, the
database's own Marlin MXFP4 rows read back through it, and gpt-oss-120b's steps with the database's
MoE operation replaced by it."""

import logging
import math
from types import SimpleNamespace

import pytest

from kvplan.errors import KvplanError
from kvplan.run.sim.cost import StepWork
from kvplan.sizing.gpus import silicon
from kvplan.sizing.gpus.silicon_marlin import MarlinExperts, fixed_time, marlin_experts
from kvplan.sizing.models.model_source import load_model_config

aic = pytest.importorskip("aiconfigurator_core")

UNCORRECTED = silicon.SiliconFit(1.0, 1.0, 0.0, 0.0)
K3 = {"_hidden_size": 3584, "_inter_size": 3072, "_topk": 16, "_num_experts": 896}  # the measured Marlin shape


def test_the_rule_by_hand():
    """Reference curve 1 -> 0.1 ms, 4 -> 0.2, 16 -> 0.8; the model routes twice the reference's
    share of experts per token (ratio 2), has half its expert weights, 3 layers."""
    experts = MarlinExperts([(1, 0.1), (4, 0.2), (16, 0.8)], ratio=2.0, weights=0.5, layers=3.0)
    assert experts.ms(0) == 0.0
    assert experts.ms(2) == pytest.approx(0.2 * 0.5 * 3)  # reference at 4 tokens, measured
    # reference at 2 tokens: halfway between 1 and 4 in log tokens, so the geometric mean of the times
    assert experts.ms(1) == pytest.approx(math.sqrt(0.1 * 0.2) * 0.5 * 3)
    assert experts.ms(16) == pytest.approx(0.8 * 32 / 16 * 0.5 * 3)  # past the largest: time grows with tokens
    # a fixed time of 0.05 ms in the reference, 0.02 in the model: only the rest scales with the weights
    fixed = MarlinExperts([(1, 0.1), (4, 0.2), (16, 0.8)], 2.0, 0.5, 3.0, fixed_ref=0.05, fixed=0.02)
    assert fixed.ms(2) == pytest.approx((0.02 + (0.2 - 0.05) * 0.5) * 3)


def test_the_fixed_time_is_the_intercept_against_one_over_moe_tp():
    assert fixed_time([1, 2], [3.0, 2.0]) == pytest.approx(1.0)  # 3 = f + c, 2 = f + c / 2
    assert fixed_time([1, 2, 4], [3.0, 2.0, 1.5]) == pytest.approx(1.0)
    assert fixed_time([4], [1.0]) == 0.0


def _op(tp: int, **shape) -> SimpleNamespace:
    return SimpleNamespace(
        **{**K3, **shape},
        _moe_tp_size=tp,
        _moe_ep_size=1,
        _workload_distribution="power_law_1.2",
        _scale_factor=2.0,
    )


def _measured(tp: int, tokens: int) -> float:
    from importlib.resources import files

    import pandas as pd

    path = files("aiconfigurator_core") / "systems/data/h100_sxm/moe/vllm/0.24.0/moe_perf.parquet"
    table = pd.read_parquet(str(path))
    rows = table[
        (table.kernel_source == "vllm_compressedtensorsw4a4mxfp4moe_marlin_marlinexperts_situ_as_silu")
        & (table.moe_tp_size == tp)
        & (table.moe_ep_size == 1)
        & (table.distribution == "power_law_1.2")
        & (table.num_tokens == tokens)
    ]
    assert len(rows) == 1
    return float(rows.latency.iloc[0])


@pytest.mark.parametrize(("tp", "tokens"), [(1, 1), (4, 1024), (8, 8192)])
def test_the_measured_shape_reads_back_its_rows_and_scales_by_its_weights(tp, tokens):
    same = marlin_experts("h100_sxm", "vllm", "0.24.0", _op(tp))
    assert not isinstance(same, str)
    assert same.ms(tokens) == pytest.approx(_measured(tp, tokens) * 2)  # 2 layers
    # twice the experts at twice the top-k: the same share of experts per token, twice the weights
    double = marlin_experts("h100_sxm", "vllm", "0.24.0", _op(tp, _num_experts=1792, _topk=32))
    assert not isinstance(double, str)
    assert double.ms(tokens) == pytest.approx(_measured(tp, tokens) * 2 * 2)


def test_no_rows_at_a_shape_is_a_reason():
    found = marlin_experts("h100_sxm", "vllm", "0.24.0", _op(64))
    assert found == "no Marlin MXFP4 expert times in h100_sxm / vllm 0.24.0 at moe_tp 64, moe_ep 1, power_law_1.2"


@pytest.fixture(scope="module")
def gptoss_tp4():
    config = load_model_config("gpt-oss-120b")[0]
    auto = silicon.silicon_cost(config, "h100_sxm", 4, fit=UNCORRECTED)
    marlin = silicon.silicon_cost(config, "h100_sxm", 4, fit=UNCORRECTED, moe_kernel="marlin")
    assert isinstance(auto, silicon.SiliconStepCost) and isinstance(marlin, silicon.SiliconStepCost)
    return auto, marlin


def _moe_ms(cost: silicon.SiliconStepCost, tokens: int, context: bool) -> float:
    """The database's own MoE operation (the Triton kernel) of gpt-oss at ``tokens``, asked directly."""
    from aiconfigurator_core.sdk import config
    from aiconfigurator_core.sdk.models import get_model
    from aiconfigurator_core.sdk.perf_database import get_database
    from aiconfigurator_core.sdk.rust_engine_step import _cached_engine_handle

    logging.disable(logging.WARNING)
    try:
        database = get_database("h100_sxm", "vllm", cost.source.version)
        model = get_model(cost.source.model_path, config.ModelConfig(tp_size=4, moe_tp_size=4, moe_ep_size=1), "vllm")
        handle = _cached_engine_handle(model, database)
    finally:
        logging.disable(logging.NOTSET)
    ops = model.context_ops if context else model.generation_ops
    (i,) = [i for i, op in enumerate(ops) if type(op).__name__ == "MoE"]
    if context:
        return sum(e[1] for e in handle.evaluate_context_ops([i], batch_size=1, s=tokens, x=tokens))
    return sum(e[1] for e in handle.evaluate_generation_ops([i], batch_size=tokens, s=1024))


@pytest.mark.parametrize("batch", [1, 16, 64])
def test_a_decode_step_swaps_the_triton_experts_for_marlins(gptoss_tp4, batch):
    auto, marlin = gptoss_tp4
    work = StepWork(0, batch, 0, batch * 1024, batch * 1024, batch * 1024)
    expected = auto.step_seconds(work) * 1e3 - _moe_ms(auto, batch, False) + marlin._experts.ms(batch)
    assert marlin.step_seconds(work) * 1e3 == pytest.approx(expected, rel=1e-9)
    assert marlin._experts.layers == 36  # gpt-oss-120b's 36 MoE layers


def test_a_prefill_step_swaps_the_triton_experts_for_marlins(gptoss_tp4):
    auto, marlin = gptoss_tp4
    work = StepWork(1024, 0, 1, 1024, 1024 * 1025 // 2, 0)
    expected = auto.step_seconds(work) * 1e3 - _moe_ms(auto, 1024, True) + marlin._experts.ms(1024)
    assert marlin.step_seconds(work) * 1e3 == pytest.approx(expected, rel=1e-9)
    # Marlin's measured throughput at 1,024-8,192 tokens is below the Triton kernel's: prefill costs more
    assert marlin._experts.ms(1024) > _moe_ms(auto, 1024, True)


def test_bad_moe_kernels_are_one_line():
    config = load_model_config("gpt-oss-120b")[0]
    with pytest.raises(KvplanError) as err:
        silicon.silicon_cost(config, "h100_sxm", 4, moe_kernel="cutlass")
    assert err.value.field == "moe_kernel" and "use one of auto, marlin" in str(err.value)
    with pytest.raises(KvplanError) as err:
        silicon.silicon_cost(load_model_config("llama-3.1-8b")[0], "h100_sxm", 1, moe_kernel="marlin")
    assert err.value.field == "moe_kernel" and "MXFP4 experts" in str(err.value)
