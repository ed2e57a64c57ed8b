"""Capacity: parameter counts against published totals, the budget, blocks, concurrency, max_model_len fit."""

import math

import pytest

from kvplan.errors import KvplanError
from kvplan.sizing.capacity import estimate_capacity
from kvplan.sizing.gpus.gpus import gpu_table, lookup_gpu
from kvplan.sizing.models.model_source import load_model_spec
from kvplan.sizing.models.model_spec import ModelSpec
from kvplan.sizing.models.weights import count_parameters, weights_bytes

GiB = 2**30


@pytest.mark.parametrize(
    "preset, expected",
    [
        # sum of the tensor element counts in the SmolLM2-135M-Instruct GGUF (gguf.GGUFReader)
        ("smollm2-135m", 134_515_008),
        # 2 x 128256 x 4096 (embeddings, lm_head)
        # + 32 x (2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336 + 2 x 4096) + 4096
        ("llama-3.1-8b", 8_030_261_248),
        # 2 x 32000 x 4096 + 32 x (41,943,040 attention + 8 x 3 x 4096 x 14336 experts + 4096 x 8 router + 8192) + 4096
        ("mixtral-8x7b", 46_702_792_704),
    ],
)
def test_parameter_count_exact(preset, expected):
    assert sum(count_parameters(load_model_spec(preset))) == expected


@pytest.mark.parametrize(
    "preset, published",
    [
        ("deepseek-v3", 671e9),  # DeepSeek-V3 report: 671B total (main model, without the MTP module)
        ("deepseek-v2-lite", 15.7e9),  # DeepSeek-V2 report: 15.7B
        ("qwen3-30b-a3b", 30.5e9),  # Qwen3 model card: 30.5B
        ("qwen3-235b-a22b", 235e9),
        ("gpt-oss-20b", 20.91e9),  # gpt-oss model card: 20.91B
        ("gpt-oss-120b", 116.83e9),  # gpt-oss model card: 116.83B
        ("lfm2-1.2b", 1.17e9),  # LFM2-1.2B model card: 1.17B (block_ff_dim 12288 adjusted to 8192)
        ("qwen3-next-80b-a3b", 80e9),  # Qwen3-Next model card: 80B in total (Gated DeltaNet mixers counted)
        ("llama-2-7b", 6.74e9),
        ("gemma-2-9b", 9.24e9),
    ],
)
def test_parameter_count_matches_published_totals(preset, published):
    assert sum(count_parameters(load_model_spec(preset))) == pytest.approx(published, rel=0.005)


def test_weights_use_the_checkpoint_quantization():
    spec = load_model_spec("deepseek-v3")  # fp8 checkpoint: fp8 layers, bf16 embeddings and lm_head
    embedding, other = count_parameters(spec)
    assert embedding == 2 * 129_280 * 7168
    assert weights_bytes(spec) == embedding * 2 + other * 1
    assert weights_bytes(spec, "int4") == (embedding + other) // 2
    with pytest.raises(KvplanError, match="weight_dtype"):
        weights_bytes(spec, "fp5")


def test_budget_blocks_and_concurrency_on_a_gpu():
    spec = load_model_spec("smollm2-135m")
    cap = estimate_capacity(spec, gpu="L4", max_model_len=8192)
    budget = int(22.03 * 0.9 * GiB) - 134_515_008 * 2 - 2 * GiB  # L4 x 0.9 - bf16 weights - 2 GiB overhead
    assert cap.kv_budget_bytes == budget
    assert cap.bytes_per_block == 23_040 * 16
    assert cap.num_blocks == budget // (23_040 * 16)
    assert cap.kv_capacity_tokens == cap.num_blocks * 16
    assert cap.max_concurrency == pytest.approx(cap.num_blocks / (8192 / 16))
    assert cap.max_model_len_fit is None


def test_tp_divides_weights_and_kv_heads():
    spec = load_model_spec("llama-3.1-70b")
    cap = estimate_capacity(spec, gpu="H100-80GB", tp=4, max_model_len=8192)
    # 2 x 128256 x 8192 + 80 x (2 x 8192^2 + 2 x 8192 x 1024 + 3 x 8192 x 28672 + 2 x 8192) + 8192 parameters, bf16
    assert cap.weights_bytes == 70_553_706_496 * 2 // 4
    assert cap.bytes_per_token == 80 * 2 * 2 * 128 * 2
    assert cap.bytes_per_token_all_ranks == 4 * cap.bytes_per_token


def test_max_model_len_fit_in_whole_blocks():
    spec = load_model_spec("llama-3.1-8b")  # 2 MiB per block of 16 tokens
    cap = estimate_capacity(spec, kv_memory_gib=4, max_model_len=131_072)
    assert cap.num_blocks == 2048
    assert cap.max_model_len_fit == 2048 * 16
    assert cap.max_concurrency == pytest.approx(2048 / 8192)
    fits = estimate_capacity(spec, kv_memory_gib=4, max_model_len=10_000)
    assert fits.max_model_len_fit is None and fits.max_concurrency == pytest.approx(2048 / 625)


def test_hybrid_model_concurrency_counts_the_windows():
    spec = load_model_spec("gemma-3-27b")
    cap = estimate_capacity(spec, kv_memory_gib=20, max_model_len=131_072)
    per_layer_block = 16 * 2 * 16 * 128 * 2
    # global layers hold 8192 blocks; a local layer holds the 64 blocks under its 1024-token window
    per_request = (10 * 8192 + 52 * 64) * per_layer_block
    assert cap.per_request_bytes == per_request
    assert cap.max_concurrency == pytest.approx(cap.num_blocks * cap.bytes_per_block / per_request)


def test_budget_below_zero_says_by_how_much():
    spec = load_model_spec("llama-3.1-70b")
    excess = 70_553_706_496 * 2 / GiB + 2 - 22.03 * 0.9
    with pytest.raises(KvplanError, match=rf"exceed 22.03 GiB x 0.9 = 19.83 GiB by {excess:.2f} GiB"):
        estimate_capacity(spec, gpu="L4")


def test_gpu_table_covers_the_required_gpus():
    required = [
        "A10G",
        "L4",
        "L40S",
        "L40",
        "A100-40GB",
        "A100-80GB",
        "H100-SXM",
        "H100-PCIe",
        "H100-NVL",
        "H20",
        "GH200",
        "H200",
        "B200",
        "B300",
        "GB200",
        "GB300",
        "RTX-PRO-6000-Server",
        "A30",
        "Arc-Pro-B60",
        "MI300X",
        "MI325X",
        "RTX-3090",
        "RTX-4090",
        "RTX-A6000",
        "RTX-4070-Laptop",
    ]
    table = gpu_table()
    for name in required:
        entry = table[name]
        assert 4 < entry["memory_gib"] < 300 and entry["source"] and entry["reported_by"], name
    # the 8 GB laptop GPU of the public serving benchmarks: 8188 MiB as torch reports it
    assert table["RTX-4070-Laptop"]["memory_gib"] == pytest.approx(8188 / 1024, abs=0.001)


@pytest.mark.parametrize(
    "typed, canonical, gib",
    [
        ("H20", "H20", 95.58),  # was H200 by prefix matching
        ("h200", "H200", 139.80),
        ("H100-80GB", "H100-SXM", 79.18),  # today's name, now an alias of the canonical one
        ("h100 sxm5", "H100-SXM", 79.18),  # any case, spaces as dashes
        ("rtx_4090", "RTX-4090", 23.68),
        ("GH200-480GB", "GH200", 95.58),
        ("gb200", "GB200", 184.31),
        ("B300 SXM6 AC", "B300", 267.69),  # nvidia-smi's name, less "NVIDIA"
        ("GB300", "GB300", 276.50),
        ("RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000-Server", 94.97),
        ("a30", "A30", 23.50),
        ("b60", "Arc-Pro-B60", 22.71),
    ],
)
def test_gpus_match_exact_names_and_listed_aliases(typed, canonical, gib):
    assert lookup_gpu(typed) == (canonical, gib)


# GPUs added for aiconfigurator-core 0.12.0's systems: the driver total kvplan uses (torch / vLLM /
# CUDA, MiB as printed where a capture printed MiB), and the nvidia-smi total in MiB that
# aiconfigurator's systems/<name>.yaml records as mem_capacity (A30, B60: their rounded 24 GiB)
@pytest.mark.parametrize(
    "name, driver_gib, nvidia_smi_mib, system",
    [
        ("GB200", 184.31, 189471, "gb200"),  # 189471 / 1024 = 185.03 GiB
        ("B300", 267.69, 275040, "b300_sxm"),  # 268.59 GiB
        ("GB300", 276.50, 284208, "gb300"),  # 277.55 GiB
        ("RTX-PRO-6000-Server", 94.97, 97887, "rtx_pro_6000_server"),  # 95.59 GiB
        ("A30", 24060 / 1024, 24576, "a30"),  # nvbench: 24060 MiB CUDA total = 23.50 GiB
        ("Arc-Pro-B60", 23256 / 1024, None, "b60"),  # torch.xpu total_memory=23256MB = 22.71 GiB
    ],
)
def test_gpus_from_aiconfigurator_hold_the_driver_total_below_nvidia_smi(name, driver_gib, nvidia_smi_mib, system):
    entry = gpu_table()[name]
    assert entry["memory_gib"] == pytest.approx(driver_gib, abs=0.005)
    assert f"aiconfigurator-core 0.12.0 systems/{system}.yaml" in entry["source"]
    if nvidia_smi_mib is not None:
        assert str(nvidia_smi_mib) in entry["source"]
        # the driver keeps about 0.3-1.1 GiB of the nvidia-smi total for itself (gpus.yaml header)
        assert 0.3 < nvidia_smi_mib / 1024 - entry["memory_gib"] < 1.1
    if entry["reported_by"] == "nvidia-smi":
        assert entry["memory_gib"] == pytest.approx(nvidia_smi_mib / 1024, abs=0.005)


def test_rtx_pro_6000_names_its_edition():
    # the Workstation and Max-Q editions run other clocks: the bare name is no alias, and no prefix
    with pytest.raises(KvplanError, match="unknown GPU 'RTX-PRO-6000'; closest: RTX-PRO-6000-Server"):
        lookup_gpu("RTX-PRO-6000")


@pytest.mark.parametrize(
    "typed, closest",
    [
        ("B20", "closest: B200, GB200, H20"),  # a prefix of B200 is not B200
        ("h100", "closest: H100-SXM, H100-PCIe, H100-NVL"),  # nor is a prefix of H100-SXM
        ("A100", "closest: A100-40GB, A100-80GB, A10G"),
    ],
)
def test_unknown_gpus_are_one_line_with_the_closest_names(typed, closest):
    with pytest.raises(KvplanError) as err:
        lookup_gpu(typed)
    assert str(err.value) == f"gpu: unknown GPU {typed!r}; {closest}; or give gpu_memory_gib"


def test_results_record_the_gpu_used_not_the_name_typed():
    cap = estimate_capacity(load_model_spec("llama-3.1-8b"), gpu="h100-80gb", max_model_len=8192)
    assert (cap.gpu, cap.gpu_memory_bytes) == ("H100-SXM", int(79.18 * GiB))


def test_bad_settings_are_named():
    spec = load_model_spec("smollm2-135m")
    for kwargs, flag in [
        (dict(block_size=0), "block_size"),
        (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
        (dict(kv_memory_gib=-1), "kv_memory_gib"),
        (dict(gpu_memory_gib=24, overhead_gib=-1), "overhead_gib"),
        (dict(gpu_memory_gib=24, weights_gib=-5), "weights_gib"),  # was a larger budget than no weights at all
        (dict(gpu_memory_gib=24, weights_gib=math.nan), "weights_gib"),
        (dict(gpu_memory_gib=math.inf), "gpu_memory_gib"),
        (dict(gpu_memory_gib=2.0**21), "gpu_memory_gib"),  # 2 PiB: above the 1 PiB bound
        (dict(kv_memory_gib=math.inf), "kv_memory_gib"),
        (dict(gpu="L4", overhead_gib=math.inf), "overhead_gib"),
        (dict(block_size=2**30 + 1), "block_size"),
        (dict(max_model_len=10**23), "max_model_len"),
    ]:
        with pytest.raises(KvplanError, match=f"^{flag}: must be "):
            estimate_capacity(spec, **kwargs)
    assert math.isclose(estimate_capacity(spec, kv_memory_gib=1).kv_budget_bytes, GiB)
    # zero weights is a real setting (the budget is then usable memory - overhead)
    zero = estimate_capacity(spec, gpu_memory_gib=10, weights_gib=0, overhead_gib=0)
    assert zero.kv_budget_bytes == int(10 * 0.9 * GiB) and zero.weights_bytes == 0


def test_max_model_len_is_capped_by_the_model_like_vllm():
    """vLLM refuses a max_model_len beyond the model's derived maximum; the default is that maximum."""
    llama = load_model_spec("llama-3.1-8b")  # max_position_embeddings 131072 (rope llama3: not scaled again)
    assert estimate_capacity(llama).max_model_len == 131_072
    assert estimate_capacity(llama, max_model_len=131_072).per_request_bytes == 16 * GiB
    with pytest.raises(
        KvplanError,
        match="^max_model_len: 131,088 exceeds the model's limit of 131,072 tokens "
        r"\(max_position_embeddings\); give at most 131072$",
    ):
        estimate_capacity(llama, max_model_len=131_088)
    yarn = ModelSpec.from_hf_config(
        {
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "max_position_embeddings": 32_768,
            "torch_dtype": "bfloat16",
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32_768},
        },
        "qwen-yarn",
    )
    assert estimate_capacity(yarn).max_model_len == 131_072  # 32,768 x 4, as vLLM derives it
    with pytest.raises(KvplanError, match=r"131,072 tokens \(scaled by its rope_scaling\)"):
        estimate_capacity(yarn, max_model_len=131_073)
    # a config naming no length: vLLM assumes 2048 as the default and the user's value is taken
    unknown = ModelSpec.from_hf_config({"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 64}, "bare")
    assert estimate_capacity(unknown).max_model_len == 2048
    # 2 layers x (K, V) x 4 KV heads x head_dim 64 x 2 bytes (a float32 checkpoint is served in fp16)
    assert estimate_capacity(unknown, max_model_len=40_960).per_request_bytes == 40_960 * 2 * 2 * 4 * 64 * 2


def test_kv_pool_is_checked_against_the_gpu_it_runs_on():
    """kv_memory_gib with a GPU: the pool must fit in the GPU's memory; the GPU is named in full."""
    spec = load_model_spec("smollm2-135m")
    with pytest.raises(KvplanError, match=r"^kv_memory_gib: a KV pool of 100 GiB exceeds the L4's 22.03 GiB of memory"):
        estimate_capacity(spec, gpu="L4", kv_memory_gib=100)
    with pytest.raises(KvplanError, match=r"^kv_memory_gib: a KV pool of 40.5 GiB exceeds gpu_memory_gib 40 GiB"):
        estimate_capacity(spec, gpu_memory_gib=40, kv_memory_gib=40.5)
    cap = estimate_capacity(spec, gpu="l4", kv_memory_gib=10)
    assert (cap.gpu, cap.gpu_memory_bytes, cap.kv_budget_bytes) == ("L4", int(22.03 * GiB), 10 * GiB)
    assert cap.overhead_bytes is None  # no budget arithmetic: the pool was given


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(kv_memory_gib=10, weights_gib=1),
            "weights_gib: kv_memory_gib gives the KV pool directly, so it has no effect; drop it or drop kv_memory_gib",
        ),
        (
            dict(gpu="L4", kv_memory_gib=10, weights_gib=1, overhead_gib=3),
            "weights_gib, overhead_gib: kv_memory_gib gives the KV pool directly, so they have no effect; "
            "drop them or drop kv_memory_gib",
        ),
        (
            dict(kv_memory_gib=10, gpu_memory_utilization=0.9),  # given, even at the default value
            "gpu_memory_utilization: kv_memory_gib gives the KV pool directly",
        ),
        (
            dict(gpu="H100-80GB", gpu_memory_gib=40),
            "gpu_memory_gib: given with gpu H100-80GB; it stands instead of gpu; drop one of the two",
        ),
        (
            dict(overhead_gib=1, gpu_memory_utilization=0.8),
            "overhead_gib, gpu_memory_utilization: no effect without a GPU to budget; "
            "give gpu or gpu_memory_gib, or drop them",
        ),
    ],
)
def test_settings_that_contradict_or_go_unused_are_refused(kwargs, message):
    with pytest.raises(KvplanError) as err:
        estimate_capacity(load_model_spec("smollm2-135m"), **kwargs)
    assert str(err.value).startswith(message)


def test_a_budget_must_hold_one_block():
    spec = load_model_spec("smollm2-135m")  # 23,040 bytes per token
    # L4: 22.03 GiB x 0.9 - 0.25 GiB weights - 2 GiB = 17.58 GiB; one block: 1e6 x 23,040 bytes = 21.46 GiB
    with pytest.raises(
        KvplanError,
        match=r"^KV budget: 17.58 GiB holds not one block of 1,000,000 tokens \(21.46 GiB "
        r"at 23,040 bytes per token\); give a smaller block_size",
    ):
        estimate_capacity(spec, gpu="L4", block_size=1_000_000)
    with pytest.raises(
        KvplanError, match=r"^KV budget: 368,639 bytes holds not one block of 16 tokens \(368,640 bytes"
    ):
        estimate_capacity(spec, kv_memory_gib=368_639 / GiB)
    one = estimate_capacity(spec, kv_memory_gib=368_640 / GiB)  # exactly one block of 16 tokens
    assert (one.num_blocks, one.kv_capacity_tokens, one.max_model_len_fit) == (1, 16, 16)


def test_fixed_state_counts_in_per_request_bytes_and_concurrency():
    spec = load_model_spec("qwen3-next-80b-a3b")
    cap = estimate_capacity(spec, kv_memory_gib=10, max_model_len=32_768)
    state = 36 * (3 * 8192 * 2 + 32 * 128 * 128 * 2)  # 36 Gated DeltaNet layers, bf16
    kv = 32_768 * 12 * 2 * 2 * 256 * 2  # 12 full-attention layers, whole blocks of 16
    assert (cap.per_request_state_bytes, cap.per_request_bytes) == (state, kv + state)
    assert cap.num_blocks == 10 * GiB // (16 * 24_576)
    assert cap.max_concurrency == pytest.approx(cap.num_blocks * 16 * 24_576 / (kv + state))
    assert cap.state_dtype == {"conv": "bf16", "recurrent": "bf16"}


def test_a_model_without_attention_has_no_blocks_only_states():
    spec = ModelSpec.from_hf_config(
        {
            "model_type": "mamba",
            "num_hidden_layers": 24,
            "hidden_size": 768,
            "intermediate_size": 1536,
            "state_size": 16,
            "conv_kernel": 4,
            "vocab_size": 50_280,
            "torch_dtype": "float32",
        },
        "mamba-130m",
    )
    cap = estimate_capacity(spec, kv_memory_gib=1, max_model_len=2048)
    # Mamba-1 per layer: conv (3, 1536) + recurrent (1536, 16), served in fp16
    state = 24 * (3 * 1536 + 1536 * 16) * 2
    assert (cap.bytes_per_token, cap.per_request_bytes, cap.num_blocks) == (0, state, None)
    assert cap.max_concurrency == pytest.approx(GiB / state)
