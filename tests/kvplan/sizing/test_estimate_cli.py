"""`kvplan estimate` end to end: tables, JSON, grid, plot, one-line errors, and the import rule."""

import json
import subprocess
import sys

import pytest

from kvplan.cli import main

GiB = 2**30


def run(monkeypatch, capsys, *args):
    """Run the console entry point in-process; return (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["kvplan", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def run_json(monkeypatch, capsys, *args):
    code, out, err = run(monkeypatch, capsys, "estimate", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_makefile_demo_renders_tables(monkeypatch, capsys):
    code, out, err = run(
        monkeypatch, capsys, "estimate", "--model", "smollm2-135m", "--gpu", "L4", "--max-model-len", "8192"
    )
    assert code == 0, err
    assert "SmolLM2-135M-Instruct: KV per token" in out and "Capacity per GPU (L4)" in out
    assert "23,040 per rank" in out


def test_json_has_the_promised_integer_keys(monkeypatch, capsys):
    result = run_json(monkeypatch, capsys, "--model", "smollm2-135m", "--gpu", "L4", "--max-model-len", "8192")
    for key in ("bytes_per_token", "bytes_per_block", "num_blocks", "kv_capacity_tokens", "per_request_bytes"):
        assert isinstance(result[key], int), key
    assert result["bytes_per_token"] == 23_040 and result["bytes_per_block"] == 368_640
    assert result["per_request_bytes"] == 8192 * 23_040
    # L4 22.03 GiB x 0.9 - weights (134,515,008 params x 2 bytes) - 2 GiB reserve, in 368,640-byte blocks
    num_blocks = int((22.03 * 0.9 * 2**30 - 134_515_008 * 2 - 2 * 2**30) // 368_640)
    assert result["num_blocks"] == num_blocks == 51_195
    assert result["max_concurrency"] == num_blocks / (8192 // 16)
    assert result["max_model_len_fit"] is None
    assert result["grid"] and result["gpu"] == "L4"


def test_grid_paged_next_to_contiguous(monkeypatch, capsys):
    result = run_json(
        monkeypatch,
        capsys,
        "--model",
        "llama-3.1-8b",
        "--max-model-len",
        "131072",
        "--context",
        "8192,32k,1000",
        "--batch",
        "1,8",
    )
    rows = {(row["context_tokens"], row["batch_size"]): row for row in result["grid"]}
    assert len(rows) == 6
    assert rows[(8192, 1)]["paged_bytes"] == 1 * GiB
    assert rows[(32768, 8)]["paged_bytes"] == 32 * GiB  # 8 requests of 32K
    # 1000 tokens: 63 blocks of 16 -> 8 empty slots; contiguous reserves 131,072 tokens
    assert rows[(1000, 1)]["paged_waste_bytes"] == 8 * 131_072
    assert rows[(1000, 1)]["contiguous_bytes"] == 16 * GiB
    assert rows[(1000, 8)]["contiguous_waste_bytes"] == 8 * (16 * GiB - 1000 * 131_072)
    assert all(row["fits"] is None for row in result["grid"])  # no GPU, no budget


def test_shared_prefix_is_stored_once(monkeypatch, capsys):
    result = run_json(
        monkeypatch,
        capsys,
        "--model",
        "llama-3.1-8b",
        "--context",
        "1000",
        "--batch",
        "8",
        "--shared-prefix-tokens",
        "500",
    )
    row = result["grid"][0]
    # 500 // 16 = 31 full prefix blocks of 2 MiB held once instead of 8 times
    assert row["paged_bytes"] == 8 * 63 * 2**21 - 7 * 31 * 2**21


def test_plot_writes_a_png_and_says_where(monkeypatch, capsys, tmp_path):
    png = tmp_path / "kv.png"
    code, out, err = run(
        monkeypatch,
        capsys,
        "estimate",
        "--model",
        "qwen3-8b",
        "--gpu",
        "H100-80GB",
        "--context",
        "4k,32k",
        "--batch",
        "1,8",
        "--plot",
        str(png),
    )
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.endswith(f"plot: {png}\n")
    # with --json the path goes to stderr: stdout stays one JSON object
    code, out, err = run(
        monkeypatch, capsys, "estimate", "--model", "qwen3-8b", "--json", "--plot", str(tmp_path / "b.PNG")
    )
    assert code == 0 and json.loads(out)["bytes_per_token"] == 36 * 2 * 8 * 128 * 2
    assert err == f"plot: {tmp_path / 'b.PNG'}\n"


def test_plot_axes_are_log_log_with_the_budget_and_max_model_len():
    """KV is linear in context: on log-log axes it is a straight line (it looked exponential on a
    log x-axis with a linear y-axis). The budget is a horizontal line, max_model_len a vertical one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvplan.sizing.estimate import estimate
    from kvplan.sizing.estimate_plot import plot_kv_vs_context
    from kvplan.sizing.models.model_source import load_model_spec

    result = estimate(
        load_model_spec("llama-3.1-8b"),
        contexts=(4096, 32_768),
        batch_sizes=(1, 8),
        gpu="H100-SXM",
        max_model_len=65_536,
    )
    fig, ax = plt.subplots()
    plot_kv_vs_context(ax, result)
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    lines = {line.get_label(): line for line in ax.get_lines()}
    x, y = lines["batch 1"].get_data()
    assert x[-1] == 65_536 and y[-1] == pytest.approx(65_536 * 131_072 / GiB)  # 8 GiB: 32 layers x 4 KiB per token
    assert list(lines["max_model_len 65,536"].get_xdata()) == [65_536, 65_536]
    budget = lines[next(label for label in lines if label.startswith("KV budget"))]
    assert budget.get_ydata()[0] == pytest.approx(result.capacity.num_blocks * result.capacity.bytes_per_block / GiB)
    plt.close(fig)


@pytest.mark.parametrize(
    "plot, message",
    [
        ("kv.txt", "error: --plot: must be a .png file (got 'kv.txt'); give a file path ending in .png"),
        ("kv", "error: --plot: must be a .png file (got 'kv')"),  # matplotlib would write kv.png
        ("folder", "error: --plot: folder is a folder"),  # matplotlib would write folder.png beside it
        ("", "error: --plot: . is a folder"),
    ],
)
def test_plot_path_must_name_a_png_file(monkeypatch, capsys, tmp_path, plot, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    code, out, err = run(monkeypatch, capsys, "estimate", "--model", "smollm2-135m", "--plot", plot)
    assert (code, out) == (2, "") and err.startswith(message) and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]  # nothing written


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "llama-3.1-9b"], "error: --model: unknown model 'llama-3.1-9b'; closest: llama-3.1-8b"),
        (["--model", "llama-3.1-70b", "--gpu", "L4"], "error: KV budget: weights 131.42 GiB + overhead 2.00 GiB"),
        (["--model", "smollm2-135m", "--tp", "2"], "error: --tp: 2 does not divide the 9 attention heads"),
        (["--model", "smollm2-135m", "--context", "8k,lots"], "error: --context: 'lots' is not a whole number"),
        (
            ["--model", "smollm2-135m", "--plot", "/no/such/dir/x.png"],
            "error: --plot: folder /no/such/dir does not exist",
        ),
        # GiB flags: finite, in range (these were OverflowError / ValueError tracebacks, or accepted)
        (
            ["--model", "llama-3.1-8b", "--kv-memory-gib", "inf"],
            "error: --kv-memory-gib: must be a finite number of GiB, > 0",
        ),
        (
            ["--model", "llama-3.1-8b", "--kv-memory-gib", "1e400"],
            "error: --kv-memory-gib: must be a finite number of GiB",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpu-memory-gib", "inf"],
            "error: --gpu-memory-gib: must be a finite number of GiB",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpu", "H100", "--weights-gib", "inf"],
            "error: --weights-gib: must be a finite number of GiB, >= 0",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpu", "H100", "--weights-gib", "nan"],
            "error: --weights-gib: must be a finite number of GiB",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpu", "H100", "--weights-gib", "-5"],  # was accepted: a larger budget
            "error: --weights-gib: must be a finite number of GiB, >= 0 and at most 1,048,576 (got -5.0)",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpu", "H100", "--overhead-gib", "inf"],
            "error: --overhead-gib: must be a finite number of GiB",
        ),
        # sizes bounded (OverflowError tracebacks before)
        (
            ["--model", "llama-3.1-8b", "--context", "99999999999999999999999"],
            "error: --context: values must be between 1 and 1,073,741,824 (got 99999999999999999999999)",
        ),
        (
            ["--model", "llama-3.1-8b", "--batch", "1,99999999999999999999999"],
            "error: --batch: values must be between 1 and 1,048,576",
        ),
        (
            ["--model", "llama-3.1-8b", "--block-size", "99999999999999999999999"],
            "error: --block-size: must be between 1 and 1,073,741,824 tokens",
        ),
        # accepted before: vLLM refuses a max_model_len beyond the model's (Llama 3.1: 131,072 positions)
        (
            ["--model", "llama-3.1-8b", "--max-model-len", "131073"],
            "error: --max-model-len: 131,073 exceeds the model's limit of 131,072 tokens (max_position_embeddings); "
            "give at most 131072",
        ),
        (
            ["--model", "llama-3.1-8b", "--context", "1000,8k", "--shared-prefix-tokens", "1001"],
            "error: --shared-prefix-tokens: must be between 0 and the shortest --context 1,000 (got 1001)",
        ),
        (
            ["--model", "smollm2-135m", "--shared-prefix-tokens", "8193"],
            "error: --shared-prefix-tokens: must be between 0 and the context (max_model_len) 8,192",
        ),
        (["--model", ""], "error: --model: the model name is empty; give a preset name"),
    ],
)
def test_bad_input_is_one_red_line(monkeypatch, capsys, args, message):
    code, out, err = run(monkeypatch, capsys, "estimate", *args)
    assert code == 2 and out == ""
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "args, message",
    [
        # a pool larger than the card was accepted and reported as 100 GiB of KV on an L4
        (
            ["--gpu", "L4", "--kv-memory-gib", "100"],
            "--kv-memory-gib: a KV pool of 100 GiB exceeds the L4's 22.03 GiB of memory; "
            "give the pool vLLM reports for this GPU, or the GPU it ran on",
        ),
        (
            ["--gpu-memory-gib", "16", "--kv-memory-gib", "20"],
            "--kv-memory-gib: a KV pool of 20 GiB exceeds --gpu-memory-gib 16 GiB of memory; "
            "give the pool vLLM reports for this GPU, or the GPU it ran on",
        ),
        # silently ignored before: the pool is given, so there is no budget arithmetic to change
        (
            ["--kv-memory-gib", "10", "--weights-gib", "1", "--overhead-gib", "3"],
            "--weights-gib, --overhead-gib: --kv-memory-gib gives the KV pool directly, so they have no effect; "
            "drop them or drop --kv-memory-gib",
        ),
        (
            ["--kv-memory-gib", "10", "--gpu-memory-utilization", "0.95"],
            "--gpu-memory-utilization: --kv-memory-gib gives the KV pool directly, so it has no effect; "
            "drop it or drop --kv-memory-gib",
        ),
        (
            ["--overhead-gib", "3"],
            "--overhead-gib: no effect without a GPU to budget; give --gpu or --gpu-memory-gib, or drop it",
        ),
        # the table was titled H100-80GB while 40 GiB were used
        (
            ["--gpu", "H100-80GB", "--gpu-memory-gib", "40"],
            "--gpu-memory-gib: given with --gpu H100-80GB; it stands instead of --gpu; drop one of the two",
        ),
        # 0 blocks and "largest max_model_len that fits 0 tokens" before
        (
            ["--gpu", "L4", "--block-size", "1000000"],
            "KV budget: 17.58 GiB holds not one block of 1,000,000 tokens (21.46 GiB at 23,040 bytes per token); "
            "give a smaller --block-size (vLLM's default is 16) or a larger budget",
        ),
        # empty lists were taken as the defaults; a bad entry was quoted lower-cased
        (["--batch", ""], "--batch: the list is empty; give numbers like 1,8,32, or leave the option out"),
        (["--context", " "], "--context: the list is empty; give numbers like 8192,32k,128k, or leave the option out"),
        (["--context", "8K,1G"], "--context: '1G' is not a whole number; give numbers like 8192,32k,128k"),
    ],
    ids=[
        "kv-pool-over-gpu",
        "kv-pool-over-gpu-memory-gib",
        "weights-overhead-with-kv-pool",
        "utilization-with-kv-pool",
        "overhead-without-gpu",
        "gpu-and-gpu-memory-gib",
        "block-over-budget",
        "empty-batch",
        "empty-context",
        "bad-suffix-as-typed",
    ],
)
def test_settings_that_cannot_hold_are_one_exact_line(monkeypatch, capsys, args, message):
    code, out, err = run(monkeypatch, capsys, "estimate", "--model", "smollm2-135m", *args)
    assert (code, out, err) == (2, "", f"error: {message}\n")


def test_kv_pool_on_a_named_gpu(monkeypatch, capsys):
    result = run_json(
        monkeypatch,
        capsys,
        "--model",
        "smollm2-135m",
        "--gpu",
        "l4",
        "--kv-memory-gib",
        "10",
        "--max-model-len",
        "8192",
    )
    assert (result["gpu"], result["gpu_memory_bytes"], result["overhead_bytes"]) == ("L4", int(22.03 * GiB), None)
    assert result["kv_budget_bytes"] == 10 * GiB and result["num_blocks"] == 10 * GiB // 368_640 == 29_127
    code, out, err = run(
        monkeypatch, capsys, "estimate", "--model", "smollm2-135m", "--gpu", "l4", "--kv-memory-gib", "10"
    )
    assert code == 0 and "Capacity per GPU (L4)" in out and "22.030 GiB" in out
    assert "weights + overhead" not in out  # neither went into the given pool


def test_context_k_and_m_suffixes_either_case(monkeypatch, capsys):
    result = run_json(monkeypatch, capsys, "--model", "llama-3.1-8b", "--context", "1M, 2k,3K,1m")
    assert [row["context_tokens"] for row in result["grid"]] == [1_048_576, 2048, 3072, 1_048_576]


def test_grid_rows_over_max_model_len_do_not_fit(monkeypatch, capsys):
    """qwen3-32b allows 40,960 tokens: a 131,072-token request cannot be served, whatever the memory
    (it showed fits: yes with no contiguous waste before)."""
    args = ("--model", "qwen3-32b", "--context", "8192,32768,131072")
    grid = run_json(monkeypatch, capsys, *args, "--gpu", "H100-80GB")["grid"]
    assert [(row["fits"], row["exceeds_max_model_len"]) for row in grid] == [
        (True, False),
        (True, False),
        (False, True),
    ]
    grid = run_json(monkeypatch, capsys, *args)["grid"]  # no GPU: unknown, except where no memory helps
    assert [row["fits"] for row in grid] == [None, None, False]
    code, out, err = run(monkeypatch, capsys, "estimate", *args, "--gpu", "H100-80GB")
    lines = {line.split()[1]: line for line in out.splitlines() if line.startswith("│ ")}
    assert code == 0 and lines["8,192"].rstrip(" │").endswith("yes")
    assert lines["131,072*"].rstrip(" │").endswith("no: over max_model_len")
    assert "* longer than max_model_len 40,960: a server refuses such a request" in out


def test_current_folder_gets_its_name(monkeypatch, capsys, tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "head_dim": 64,
                "torch_dtype": "bfloat16",
            }
        )
    )
    monkeypatch.chdir(folder)
    assert run_json(monkeypatch, capsys, "--model", ".")["model"] == "my-model"  # was ""
    code, out, err = run(monkeypatch, capsys, "estimate", "--model", ".")
    assert code == 0 and out.startswith("my-model: KV per token")


def test_config_missing_field_and_unreadable_file(monkeypatch, capsys, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_hidden_layers": 4, "num_attention_heads": 4}))  # no head_dim, no hidden_size
    code, _, err = run(monkeypatch, capsys, "estimate", "--model", str(config))
    assert code == 2 and "missing field head_dim" in err and err.count("\n") == 1
    config.write_text(json.dumps({"num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 64}))
    code, _, err = run(monkeypatch, capsys, "estimate", "--model", str(config), "--gpu", "L4")
    assert code == 2 and "missing field hidden_size" in err  # the weights need it
    config.write_bytes(b"\xff\xfe\x00binary")
    code, _, err = run(monkeypatch, capsys, "estimate", "--model", str(config))
    assert code == 2 and err.startswith(f"error: {config}: not valid JSON") and err.count("\n") == 1
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00truncated")
    code, _, err = run(monkeypatch, capsys, "estimate", "--model", str(gguf))
    assert code == 2 and err.startswith(f"error: {gguf}: not a readable GGUF file") and err.count("\n") == 1


@pytest.mark.parametrize(
    "change, message",
    [
        ({"num_key_value_heads": float("nan")}, "field num_key_value_heads must be a whole number >= 1 (got nan)"),
        ({"head_dim": 1e308}, "field head_dim must be at most 2,147,483,647 (got 1e+308)"),
        (
            {"sliding_window": 128, "layer_types": ["sliding_attention"] * 5},
            "field layer_types must list one type per layer, 32 strings",
        ),
        ({"quantization_config": "abc"}, "field quantization_config must be a mapping of keys to values (got 'abc')"),
        ({"text_config": "abc"}, "field text_config must be a mapping of keys to values (got 'abc')"),
    ],
)
def test_bad_config_json_is_one_red_line(monkeypatch, capsys, tmp_path, change, message):
    """Tracebacks before (ValueError, OverflowError, IndexError, AttributeError); the config
    otherwise is Llama-3.1-8B's."""
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "max_position_embeddings": 131072,
                **change,
            }
        )
    )
    code, out, err = run(monkeypatch, capsys, "estimate", "--model", str(config))
    assert (code, out) == (2, "") and err.startswith(f"error: {config}: {message}") and err.count("\n") == 1


def test_usage_errors_are_one_line_with_exit_2(monkeypatch, capsys):
    code, _, err = run(monkeypatch, capsys, "estimate", "--model", "smollm2-135m", "--no-such-flag")
    assert code == 2 and err.startswith("error: No such option: --no-such-flag") and err.count("\n") == 1
    code, _, err = run(monkeypatch, capsys, "estimate", "--model", "smollm2-135m", "--tp", "two")
    assert code == 2 and err.startswith("error: Invalid value for '--tp'") and err.count("\n") == 1
    assert err.rstrip().endswith("see `kvplan estimate --help`")
    code, _, err = run(monkeypatch, capsys, "estimate")
    assert (code, err) == (2, "error: Missing option '--model'; see `kvplan estimate --help`\n")


def test_estimate_imports_neither_torch_nor_transformers():
    script = (
        "import sys\n"
        "from kvplan.cli import main\n"
        "sys.argv = ['kvplan', 'estimate', '--model', 'llama-3.1-8b', '--gpu', 'H100-80GB', '--json']\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'pandas', 'matplotlib') if m in sys.modules)\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("HEAVY=")
