"""Start a real llama.cpp ``llama-server`` for the tests, and record the KV buffer it prints.

The binary comes from the environment variable ``KVPLAN_LLAMA_SERVER``, else ``llama-server`` on
PATH; neither the project's venv nor PyPI's llama-cpp-python wheel has one (/tmp/llamacpp/SERVER.txt
on the machine that recorded the data says how it was built). To record the server's cases into
tests/kvplan/data/llamacpp_kv_buffers.yaml (printed as YAML, to be appended to its ``cases``)::

    KVPLAN_LLAMA_SERVER=/path/to/llama-server .venv/bin/python -m tests.kvplan.run.server.llama_server SMOLLM2.gguf

Each case is one server start with ``--ctx-size``, ``--parallel``, ``--cache-type-k/-v`` (and
``--kv-unified``), flash attention on for a quantised V (llama.cpp needs it there), read until
``/health`` answers 200; its log is parsed as tests/kvplan/sizing/llamacpp_probe.py parses a
library context's (the same ``llama_context:`` and ``llama_kv_cache:`` lines).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.kvplan.sizing import llamacpp_probe

# llama-server flags per case (kvplan estimate's names), recorded as source "llama-server <version>"
CASES = [
    {"model": llamacpp_probe.SMOLLM2, "ctx_size": 2048, "parallel": 2, "cache_type_k": "f16", "cache_type_v": "f16"},
    {"model": llamacpp_probe.SMOLLM2, "ctx_size": 1000, "parallel": 3, "cache_type_k": "f16", "cache_type_v": "f16"},
    {"model": llamacpp_probe.SMOLLM2, "ctx_size": 4096, "parallel": 1, "cache_type_k": "q8_0", "cache_type_v": "q8_0"},
    {"model": llamacpp_probe.SMOLLM2, "ctx_size": 2048, "parallel": 4, "cache_type_k": "q8_0", "cache_type_v": "q8_0"},
    {"model": llamacpp_probe.SMOLLM2, "ctx_size": 4096, "parallel": 2, "cache_type_k": "q4_0", "cache_type_v": "q4_0"},
    {"model": llamacpp_probe.SMOLLM2, "ctx_size": 2048, "parallel": 1, "cache_type_k": "q8_0", "cache_type_v": "f16"},
    {"model": llamacpp_probe.SMOLLM2, "ctx_size": 4096, "parallel": None, "cache_type_k": "f16", "cache_type_v": "f16"},
]


def binary() -> str | None:
    """The llama-server to run: ``$KVPLAN_LLAMA_SERVER``, else ``llama-server`` on PATH; None if
    neither is an executable file."""
    path = os.environ.get("KVPLAN_LLAMA_SERVER") or shutil.which("llama-server")
    return path if path and os.path.isfile(path) and os.access(path, os.X_OK) else None


def version(path: str) -> str:
    """What ``llama-server --version`` says after ``version:`` (``0.5.0-dev (build 1, commit 0c1e570)``)."""
    done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("version:")]
    return lines[0].removeprefix("version:").strip() if lines else (done.stdout + done.stderr).strip()


def flags(settings: dict) -> list[str]:
    """A case's settings as llama-server flags (None: left at llama-server's default)."""
    out = ["--cache-type-k", settings["cache_type_k"], "--cache-type-v", settings["cache_type_v"]]
    if settings.get("ctx_size") is not None:
        out += ["--ctx-size", str(settings["ctx_size"])]
    if settings.get("parallel") is not None:
        out += ["--parallel", str(settings["parallel"])]
    if settings.get("kv_unified"):
        out.append("--kv-unified")
    if settings["cache_type_v"] not in ("f16", "bf16", "f32"):
        out += ["--flash-attn", "on"]  # a quantised V needs flash attention
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, port: int, log: Path, timeout_s: float, name: str) -> None:
    """Return once ``http://127.0.0.1:PORT/health`` answers 200.

    Raises:
        RuntimeError: ``proc`` exited, or ``timeout_s`` passed first (with the log's tail).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not start (exit {proc.returncode}): {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)


@contextlib.contextmanager
def serve(path: str, model: str, settings: dict, log: Path, timeout_s: float = 120.0) -> Iterator[str]:
    """Run ``path -m model`` with ``flags(settings)``, ``--metrics``, 1 thread (CI machines are
    small) and the log verbosity that prints the KV sizes (4), on 127.0.0.1, until the block
    ends; yields its OpenAI base URL (``http://127.0.0.1:PORT/v1``) once ``/health`` answers 200.
    Its stdout and stderr go to ``log``.

    Raises:
        RuntimeError: it exited, or was not healthy within ``timeout_s`` (the log's tail said).
    """
    port = free_port()
    args = [path, "-m", model, *flags(settings), "--metrics", "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "w") as out:
        # --log-verbosity 4: newer builds print the llama_context/llama_kv_cache lines at that level only
        args += ["--threads", "1", "--no-webui", "--log-verbosity", "4"]
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_healthy(proc, port, log, timeout_s, "llama-server")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def record(path: str, smollm2: str, folder: Path) -> list[dict]:
    """Every case of CASES served once: the data file's case entries, with ``source``."""
    source = f"llama-server {version(path)}"
    cases = []
    for i, settings in enumerate(CASES):
        log = folder / f"llama-server-{i}.log"
        with serve(path, smollm2, settings, log):
            pass
        got = llamacpp_probe.parse_log(log.read_text())
        printed = {**got.context, "caches": got.caches, "buffer_mib": got.buffer_mib}
        cases.append({"source": source, "settings": settings, "printed": printed, "lines": got.lines})
    return cases


if __name__ == "__main__":
    import tempfile

    import yaml

    server = binary()
    if server is None:
        sys.exit("no llama-server: set KVPLAN_LLAMA_SERVER or put it on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        print(yaml.safe_dump(record(server, sys.argv[1], Path(tmp)), sort_keys=False, width=200), end="")
