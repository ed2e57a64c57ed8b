"""Load-test input that only the run can check: the report folder, and every sampled request
against the engine that was built.

The YAML cannot say whether a request fits: the KV pool in blocks and the engine's max_model_len
are known only once the engine is built, and a request's length only once prompts are sampled.
A request that can never fit would finish at once as ``cannot_fit`` and the run would "complete"
having measured nothing, so it is refused before the first step, as the engine's scheduler
would price it (vLLM's: the last output token is sampled, never written to the cache)::

    KV tokens = prompt + output - 1  ->  blocks = ceil(KV tokens / block_size)  <=  pool blocks
    prompt + output                                                             <=  max_model_len

The run folder is created only after these checks, so bad input leaves nothing behind.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.prompts import SampledRequest
from kvplan.workload import Workload

REPORTS_ROOT = Path("reports")
_NAME_MAX = 255  # bytes in one path component on Linux filesystems


def check_out(run_dir: Path | None) -> None:
    """Refuse an ``--out`` that cannot become a new run folder, before the model loads: a
    non-empty folder (appending would mix two runs' records), a file, a path under a file, a
    component longer than the filesystem allows.

    Raises:
        KvplanError: naming ``--out``.
    """
    if run_dir is None:
        return
    fix = "give a new folder (or remove that one)"
    if any(len(part.encode()) > _NAME_MAX for part in run_dir.parts):
        raise KvplanError("--out", f"a folder name in {str(run_dir)[:60]}... is over {_NAME_MAX} bytes",
                          "give a shorter path")
    try:
        if run_dir.is_dir():
            if any(run_dir.iterdir()):
                raise KvplanError("--out", f"{run_dir} is not empty", fix)
            return
    except OSError as err:
        raise KvplanError("--out", f"cannot read {run_dir} ({err.strerror or err})", fix) from None
    if run_dir.exists():
        raise KvplanError("--out", f"{run_dir} is a file, not a folder", "give a new folder path")
    above = next((p for p in run_dir.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise KvplanError("--out", f"{above} is a file, so {run_dir} cannot be a folder", "give a new folder path")


def create_run_dir(workload: Workload, run_dir: Path | None, root: Path = REPORTS_ROOT) -> Path:
    """Create the run folder: ``run_dir``, or ``<root>/<name>-<YYYYmmdd-HHMMSS>/`` with a counter
    if that second is taken.

    Raises:
        KvplanError: the folder cannot be created (read-only place, a file in the way, ...).
    """
    if run_dir is not None:
        _mkdir(run_dir, "--out", "give a writable folder path")
        return run_dir
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        path = root / (f"{workload.name}-{stamp}" + (f"-{n}" if n else ""))
        if _mkdir(path, str(root), "pass --out with a writable folder path", exist_ok=False):
            return path
    raise KvplanError(str(root), "cannot create a new run folder (1000 taken this second)", "pass --out")


def _mkdir(path: Path, where: str, fix: str, exist_ok: bool = True) -> bool:
    """True when ``path`` was created (or, with exist_ok, is an empty folder already)."""
    try:
        path.mkdir(parents=True, exist_ok=exist_ok)
        return True
    except FileExistsError:
        if exist_ok:  # a file where the folder should be
            raise KvplanError(where, f"cannot create folder {path} (a file is in the way)", fix) from None
        return False
    except OSError as err:
        raise KvplanError(where, f"cannot create folder {path} ({err.strerror or err})", fix) from None


def _longest_part(index: int, request: SampledRequest) -> tuple[str, str]:
    """(the YAML field that contributes most tokens to ``request``, its tokens spelled out)."""
    prefix, own = request.num_prefix_tokens, request.num_prompt_tokens - request.num_prefix_tokens
    parts = [(own, f"buckets[{index}].input_tokens"), (request.max_tokens, f"buckets[{index}].output_tokens")]
    if prefix:
        parts.append((prefix, "shared_prefix.num_tokens"))
    spelled = (f"prefix {prefix} + " if prefix else "") + f"{own} + {request.max_tokens}"
    return max(parts, key=lambda part: part[0])[1], spelled


def check_requests_fit(workload: Workload, engine, sampled: dict[str, list[SampledRequest]]) -> None:
    """Refuse a bucket with a sampled request the engine could never run (see the module's
    formulas). ``engine``: its public ``block_size``, ``num_blocks``, ``max_model_len``.

    Raises:
        KvplanError: ``<workload>: buckets[i].<field>: the longest request (200 + 12 tokens) needs
            53 blocks of 4 tokens, the KV pool has 48; lower it or grow engine.num_blocks``, the
            field being whichever of input_tokens, output_tokens or shared_prefix.num_tokens
            gives the request most tokens; or the same for max_model_len.
    """
    pool_field = "num_blocks" if workload.engine.num_blocks is not None else "kv_cache_memory"
    for index, bucket in enumerate(workload.buckets):
        requests = sampled.get(bucket.name) or []
        if not requests:
            continue
        longest = max(requests, key=lambda r: r.num_tokens)  # most tokens is most blocks
        field, spelled = _longest_part(index, longest)
        where = f"{workload.source}: {field}"
        blocks = -(-(longest.num_tokens - 1) // engine.block_size)
        if blocks > engine.num_blocks:
            raise KvplanError(where, f"the longest request ({spelled} tokens) needs {blocks} blocks of"
                              f" {engine.block_size} tokens, the KV pool has {engine.num_blocks}",
                              f"lower it or grow engine.{pool_field}")
        if longest.num_tokens > engine.max_model_len:
            limit = (f"engine.max_model_len {engine.max_model_len}" if workload.engine.max_model_len is not None
                     else f"the engine's max_model_len {engine.max_model_len} (by default the smaller of the KV"
                          " pool's tokens and the model's max_position_embeddings)")
            raise KvplanError(where, f"the longest request ({spelled} = {longest.num_tokens} tokens) exceeds {limit}",
                              "lower it or raise engine.max_model_len")
