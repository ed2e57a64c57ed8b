"""The silicon cost model (kvplan.sizing.gpus.silicon) against aiconfigurator-core's own step estimates.

aiconfigurator composes a decode step and a mixed prefill/decode step itself
(``estimate_decode_step_latency_with_rust``, ``estimate_mixed_step_breakdown_with_rust``); kvplan
asks the same database for the operations of the step the scheduler scheduled. On a step whose
shapes sit on kvplan's rounding grid both must give the same milliseconds.
"""

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.errors import KvplanError
from kvplan.run.sim.cost import StepWork
from kvplan.sizing.gpus import silicon
from kvplan.sizing.models.model_source import load_model_config

aic = pytest.importorskip("aiconfigurator_core")

UNCORRECTED = silicon.SiliconFit(1.0, 1.0, 0.0, 0.0)


@pytest.fixture(scope="module")
def llama_tp2():
    """kvplan's cost model and aiconfigurator's own model and database for Llama-3.1-8B, tp 2, H100, vLLM."""
    from aiconfigurator_core.sdk import config
    from aiconfigurator_core.sdk.models import get_model
    from aiconfigurator_core.sdk.perf_database import get_database

    cost = silicon.silicon_cost(load_model_config("llama-3.1-8b")[0], "h100_sxm", 2, fit=UNCORRECTED)
    assert isinstance(cost, silicon.SiliconStepCost), cost
    logging.disable(logging.WARNING)
    try:
        database = get_database("h100_sxm", "vllm", cost.source.version)
        model = get_model(cost.source.model_path, config.ModelConfig(tp_size=2), "vllm")
    finally:
        logging.disable(logging.NOTSET)
    return cost, model, database


def test_the_source_names_system_backend_and_newest_version(llama_tp2):
    cost = llama_tp2[0]
    versions = silicon.database_versions("h100_sxm", "vllm")
    assert cost.source.version in versions
    assert cost.source.model_path == "meta-llama/Meta-Llama-3.1-8B"
    assert cost.source.label == f"silicon: h100_sxm / vllm {cost.source.version}"


@pytest.mark.parametrize("batch", [1, 8, 32, 100])
def test_a_decode_step_costs_what_aiconfigurator_says(llama_tp2, batch):
    from aiconfigurator_core.sdk.rust_engine_step import estimate_decode_step_latency_with_rust

    cost, model, database = llama_tp2
    isl, osl = 1024, 254
    context = isl + osl // 2 + 1  # aiconfigurator's decode context: 1152, on kvplan's grid
    assert silicon._q(context) == context
    theirs = estimate_decode_step_latency_with_rust(model, database, gen_tokens=batch, isl=isl, osl=osl)
    work = StepWork(0, batch, 0, batch * context, batch * context, batch * context)
    assert cost.step_seconds(work) * 1e3 == pytest.approx(theirs, rel=1e-9)


@pytest.mark.parametrize("decodes", [0, 16])
def test_a_mixed_step_costs_what_aiconfigurator_says(llama_tp2, decodes):
    """One whole 96-token prompt and ``decodes`` decodes at context 1152: aiconfigurator's three
    parts (shared non-attention ops, context attention, decode attention)."""
    from aiconfigurator_core.sdk.rust_engine_step import estimate_mixed_step_breakdown_with_rust

    cost, model, database = llama_tp2
    prompt, osl = 96, 2 * (1152 - 96 - 1)  # decode context isl + osl // 2 + 1 = 1152
    parts = estimate_mixed_step_breakdown_with_rust(
        model, database, ctx_tokens=prompt, gen_tokens=decodes, isl=prompt, osl=osl, prefix=0
    )["component_latency_ms"]
    d = decodes * 1152
    work = StepWork(prompt, decodes, 1, prompt + d, prompt * (prompt + 1) // 2 + d, d)
    # aiconfigurator prices the LM head of a mixed step at ctx + gen tokens; kvplan at the sampled
    # positions (decodes + the prompt's last): the difference is that one GEMM's
    shared = cost._ms("shared", prompt + decodes, decodes + 1)
    assert shared == pytest.approx(parts["shared_non_attention"], rel=0.05)
    assert cost._ms("context_attention", 1, prompt, 0) == pytest.approx(parts["context_attention"], rel=1e-9)
    if decodes:
        assert cost._ms("decode_attention", decodes, 1152) == pytest.approx(parts["decode_attention"], rel=1e-9)
    expected = shared + parts["context_attention"] + parts["decode_attention"]
    assert cost.step_seconds(work) * 1e3 == pytest.approx(expected, rel=1e-9)


def test_the_fit_scales_and_adds_its_overheads(llama_tp2):
    cost = llama_tp2[0]
    fit = silicon.SiliconFit(1.25, 1.5, 0.002, 0.0001, 0.00003)
    assert cost.num_layers == 32  # Llama-3.1-8B's, from its config
    fitted = silicon.SiliconStepCost(cost.source, cost._handle, cost._ctx, cost._gen, fit, cost.num_layers)
    fixed = 0.002 + 32 * 0.00003  # per step, and per layer per step
    decode = StepWork(0, 8, 0, 8 * 1152, 8 * 1152, 8 * 1152)  # 8 sequences
    assert fitted.step_seconds(decode) == pytest.approx(1.25 * cost.step_seconds(decode) + fixed + 8e-4, rel=1e-12)
    mixed = StepWork(96, 8, 1, 96 + 8 * 1152, 96 * 97 // 2 + 8 * 1152, 8 * 1152)  # 9 sequences
    assert fitted.step_seconds(mixed) == pytest.approx(1.5 * cost.step_seconds(mixed) + fixed + 9e-4, rel=1e-12)


@given(st.integers(min_value=1, max_value=10**9))
def test_shapes_round_within_0_8_percent(x):
    q = silicon._q(x)
    if x <= 128:
        assert q == x
    else:
        assert abs(q - x) / x <= 2**-7
        assert silicon._q(q) == q  # a grid point stays put


@pytest.mark.parametrize(
    ("preset", "weight_dtype", "expected"),
    [
        ("llama-3.1-8b", "auto", "meta-llama/Meta-Llama-3.1-8B"),
        ("llama-3.1-70b", "auto", "meta-llama/Meta-Llama-3.1-70B"),
        ("qwen3-32b", "auto", "Qwen/Qwen3-32B"),
        ("qwen3-32b", "fp8", "Qwen/Qwen3-32B-FP8"),
        ("qwen3-235b-a22b", "fp8", "Qwen/Qwen3-235B-A22B-FP8"),
        ("gpt-oss-120b", "auto", "openai/gpt-oss-120b"),
        ("smollm2-135m", "auto", None),
    ],
)
def test_models_are_matched_by_shape(preset, weight_dtype, expected):
    assert silicon.match_model(load_model_config(preset)[0], weight_dtype) == expected


def test_what_the_database_lacks_is_a_reason_not_an_error():
    config = load_model_config("llama-3.1-8b")[0]
    assert silicon.silicon_cost(config, None, 1) == "no aiconfigurator system for this GPU"
    assert "no sglang data for h100_pcie" in silicon.silicon_cost(config, "h100_pcie", 1, "sglang")
    assert silicon.silicon_cost(load_model_config("smollm2-135m")[0], "h100_sxm", 1) == (
        "no aiconfigurator model config has this model's shape"
    )


def test_a_bad_backend_or_version_is_an_error_naming_the_known_ones():
    config = load_model_config("llama-3.1-8b")[0]
    with pytest.raises(KvplanError) as bad:
        silicon.silicon_cost(config, "h100_sxm", 1, "tgi")
    assert bad.value.field == "backend" and "vllm, sglang, trtllm" in bad.value.fix
    with pytest.raises(KvplanError) as old:
        silicon.silicon_cost(config, "h100_sxm", 1, "vllm", "0.1.0")
    assert old.value.field == "backend_version"
    assert all(v in old.value.fix for v in silicon.database_versions("h100_sxm", "vllm"))
    with pytest.raises(KvplanError) as ep:
        silicon.silicon_cost(config, "h100_sxm", 4, ep=3)
    assert ep.value.field == "ep"


def test_the_stored_fit_is_read_in_seconds_per_backend():
    import yaml

    stored = yaml.safe_load(silicon.FIT_FILE.read_text())["backends"]
    assert sorted(stored) == sorted(silicon.BACKENDS)  # every backend fitted (SGLang since prefill_first)
    for backend, entry in stored.items():
        fit = silicon.silicon_fit(backend)
        assert (fit.decode_scale, fit.prefill_scale) == (entry["decode_scale"], entry["prefill_scale"])
        assert fit.step_overhead_s == pytest.approx(entry["step_overhead_ms"] / 1000, rel=1e-12)
        assert fit.seq_overhead_s == pytest.approx(entry["seq_overhead_ms"] / 1000, rel=1e-12)
        assert fit.layer_overhead_s == pytest.approx(entry["layer_overhead_ms"] / 1000, rel=1e-12)
        assert f"H100-SXM rows of {backend}" in fit.fitted_on


def test_a_kv_cache_or_tp_the_database_does_not_measure_is_a_reason():
    """Its databases measure bf16 and fp8 KV caches, and all-reduce within one NVLink domain:
    eight GPUs on an HGX H100 board, 72 in a GB200 NVL72 rack."""
    config = load_model_config("llama-3.1-8b")[0]
    for kv in ("int8", "int4", "fp32"):
        assert silicon.silicon_cost(config, "h100_sxm", 1, kv_cache_dtype=kv) == (
            f"its database has no {kv} KV cache (it has bf16, fp16, fp8)"
        )
    assert silicon.nvlink_domain("h100_sxm") == 8 and silicon.nvlink_domain("gb200") == 72
    assert silicon.silicon_cost(config, "h100_sxm", 16) == "its data covers tp up to 8 (one NVLink domain of h100_sxm)"
    assert isinstance(silicon.silicon_cost(config, "h100_sxm", 8), silicon.SiliconStepCost)


def test_vllms_fp8_kv_names_are_priced_as_fp8():
    config = load_model_config("llama-3.1-8b")[0]
    work = StepWork(0, 16, 0, 16 * 2048, 16 * 2048, 16 * 2048)  # 16 decodes at 2,048 tokens of context
    seconds = {
        kv: silicon.silicon_cost(config, "h100_sxm", 1, kv_cache_dtype=kv, fit=UNCORRECTED).step_seconds(work)
        for kv in ("fp8", "fp8_e4m3", "fp8_e5m2", "bf16")
    }
    assert seconds["fp8"] == seconds["fp8_e4m3"] == seconds["fp8_e5m2"]
    assert seconds["fp8"] < seconds["bf16"]  # half the KV bytes to read at 2,048 tokens of context


def test_a_model_aiconfigurator_would_download_is_not_matched(monkeypatch):
    """Mixtral's config ships in aiconfigurator-core 0.12.0, but it is no model it reads offline
    (``DefaultHFModels``): it would fetch the config from Hugging Face, and kvplan stays offline."""
    import urllib.request
    from importlib.resources import files

    def no_network(*args, **kwargs):
        raise AssertionError("kvplan asked the network")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    shipped = files("aiconfigurator_core") / "model_configs" / "mistralai--Mixtral-8x7B-v0.1_config.json"
    assert shipped.is_file() and "mistralai/Mixtral-8x7B-v0.1" not in silicon.bundled_configs()
    mixtral = load_model_config("mixtral-8x7b")[0]
    assert silicon.match_model(mixtral) is None
    assert silicon.silicon_cost(mixtral, "h100_sxm", 2) == "no aiconfigurator model config has this model's shape"


def test_an_aiconfigurator_error_is_shortened_to_one_line_without_paths():
    config = load_model_config("llama-3.1-8b")[0]
    reason = silicon.silicon_cost(config, "h100_sxm", 1, weight_dtype="int4")
    assert reason == (
        "aiconfigurator-core cannot price it (PerfDataNotAvailableError: GEMM perf data missing for quant 'int4_wo'; "
        'available: ["bfloat16", "fp8", "fp8_block"])'
    )
    long = "missing system flops: quant mode 'fp8' needs 'fp8_tc_flops', which this system's YAML does not define"
    assert silicon._short(long + " (or defines as a non-positive placeholder)\nsecond line") == (
        "missing system flops: quant mode 'fp8' needs 'fp8_tc_flops', which this system's YAML does not define (or "
        "defines as a ..."
    )


@pytest.mark.parametrize("backend", ["trtllm", "sglang", "vllm"])
def test_an_mla_model_is_priced_on_silicon_with_bf16_attention(backend):
    """DeepSeek-V3 (MLA, an FP8 checkpoint) on B200, tp 8, experts split 8 ways: aiconfigurator's
    default FP8 attention has no MLA rows, so kvplan names bf16 attention; its decode step then
    equals aiconfigurator's own decode-step estimate for the same model config."""
    from aiconfigurator_core.sdk import common, config
    from aiconfigurator_core.sdk.models import get_model
    from aiconfigurator_core.sdk.perf_database import get_database
    from aiconfigurator_core.sdk.rust_engine_step import estimate_decode_step_latency_with_rust

    cost = silicon.silicon_cost(
        load_model_config("deepseek-v3")[0], "b200_sxm", 8, backend=backend, ep=8, fit=UNCORRECTED
    )
    assert isinstance(cost, silicon.SiliconStepCost), cost
    logging.disable(logging.WARNING)
    try:
        database = get_database("b200_sxm", backend, cost.source.version)
        mc = config.ModelConfig(tp_size=8, moe_tp_size=1, moe_ep_size=8, fmha_quant_mode=common.FMHAQuantMode.bfloat16)
        model = get_model(cost.source.model_path, mc, backend)
    finally:
        logging.disable(logging.NOTSET)
    batch, isl, osl = 32, 1024, 254
    context = isl + osl // 2 + 1
    theirs = estimate_decode_step_latency_with_rust(model, database, gen_tokens=batch, isl=isl, osl=osl)
    work = StepWork(0, batch, 0, batch * context, batch * context, batch * context)
    assert cost.step_seconds(work) * 1e3 == pytest.approx(theirs, rel=1e-9)


STEPS = st.lists(  # (prefill tokens, prefill chunks, decodes, context per decode, cached per chunk)
    st.tuples(
        st.sampled_from([0, 0, 1, 96, 700, 5000]),
        st.integers(1, 4),
        st.integers(0, 300),
        st.integers(1, 9000),
        st.integers(0, 3000),
    ),
    min_size=1,
    max_size=30,
)


def _work(prefill: int, chunks: int, decodes: int, per_decode: int, cached: int) -> StepWork:
    if not prefill:
        decodes = max(decodes, 1)
    chunks = min(chunks, prefill) if prefill else 0
    d = decodes * per_decode
    context = prefill + chunks * cached + d
    return StepWork(prefill, decodes, chunks, context, context, d)


@settings(max_examples=25, deadline=None)
@given(first=STEPS, then=STEPS)
def test_cost_models_on_one_engine_share_their_answers(first, then):
    """kvplan plan judges one GPU, tp and dtypes at several max_num_seqs in one process: each
    judgement's cost model (here with another fit) reuses the shapes the others asked, and its step
    times are float for float those of a cost model that asks every shape itself."""
    config = load_model_config("llama-3.1-8b")[0]
    fit = silicon.SiliconFit(1.25, 1.5, 0.002, 0.0001, 0.00003)
    one = silicon.silicon_cost(config, "h100_sxm", 2, fit=UNCORRECTED)
    other = silicon.silicon_cost(config, "h100_sxm", 2, fit=fit)
    assert isinstance(one, silicon.SiliconStepCost) and isinstance(other, silicon.SiliconStepCost)
    assert other._memo is one._memo  # one engine in this process: one memo
    for step in first:
        one.step_seconds(_work(*step))
    alone = silicon.SiliconStepCost(other.source, other._handle, other._ctx, other._gen, fit, other.num_layers)
    assert alone._memo is not one._memo
    for step in first + then:
        work = _work(*step)
        assert other.step_seconds(work) == alone.step_seconds(work)


def test_the_first_probes_all_run_and_raise_the_first_error_in_their_order():
    """An engine's first probes run side by side (kvplan.sizing.gpus.silicon_spec.first_calls): each
    runs although another fails, and the error raised is the first probe's in the order given,
    as one after another would raise it."""
    import threading

    from kvplan.sizing.gpus.silicon_spec import first_calls

    ran, barrier = [], threading.Barrier(3, timeout=10)

    def probe(i, error=None):
        def run():
            barrier.wait()  # all three at once: they run on threads of their own
            ran.append(i)
            if error is not None:
                raise error

        return run

    with pytest.raises(KeyError, match="second"):
        first_calls(probe(0), probe(1, KeyError("second")), probe(2, ValueError("third")))
    assert sorted(ran) == [0, 1, 2]
    ran.clear()
    first_calls(probe(0), probe(1), probe(2))
    assert sorted(ran) == [0, 1, 2]
    assert not [t for t in threading.enumerate() if t.name.startswith("kvplan-silicon-warm-up")]  # all joined
