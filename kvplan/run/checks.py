"""Load-test input that only the run can check: every sampled request against the engine that was built.

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

from collections.abc import Callable

from kvplan.errors import KvplanError
from kvplan.results.run_result import EngineFacts
from kvplan.traffic.requests import SampledRequest
from kvplan.workload.buckets import Bucket
from kvplan.workload.schema import Workload


def _longest_part(index: int, bucket: Bucket, request: SampledRequest) -> tuple[str, str]:
    """(the YAML field that contributes most tokens to ``request``, its tokens spelled out)."""
    prefix, own = request.num_prefix_tokens, request.num_prompt_tokens - request.num_prefix_tokens
    if request.source.startswith("trace:"):  # a trace's line (kvplan.traffic.trace): its lengths, clipped or not
        line = request.source.removeprefix("trace:")
        return "dataset.max_input_tokens", f"the trace's line {line}, {own} + {request.max_tokens}"
    names = [c.name for c in bucket.classes]
    c = names.index(request.request_class) if request.request_class in names else 0
    at = f"buckets[{index}]."
    parts = [
        (own, at + bucket.class_field(c, "input_tokens")),
        (request.max_tokens, at + bucket.class_field(c, "output_tokens")),
    ]
    if request.turn is not None and request.turn > 1:  # a session's later turn: its prompt holds the history
        return "dataset.sessions.max_turns", f"turn {request.turn}, history and message {own} + {request.max_tokens}"
    if prefix:
        parts.append((prefix, "shared_prefix.num_tokens"))
    spelled = (f"prefix {prefix} + " if prefix else "") + f"{own} + {request.max_tokens}"
    return max(parts, key=lambda part: part[0])[1], spelled


def _stddev_field(index: int, bucket: Bucket, field: str, engine: EngineFacts) -> str:
    """``buckets[i].protocol.<side>_stddev`` for a request too long for ``engine`` whose longest
    part is a length an AIPerf/GuideLLM protocol drew with that stddev while its nominal lengths
    (``input_len`` + ``output_len``, the protocol's L) fit: the stddev, not L, is what to lower.
    Otherwise ``field`` as it was."""
    protocol, at = bucket.protocol, f"buckets[{index}]."
    if protocol is None or protocol.input_len is None or protocol.output_len is None:
        return field
    nominal = protocol.input_len + protocol.output_len
    if -(-(nominal - 1) // engine.block_size) > engine.num_blocks or nominal > engine.max_model_len:
        return field
    for side in ("input", "output"):
        if field == f"{at}{side}_tokens" and getattr(protocol, f"{side}_stddev", None):
            return f"{at}protocol.{side}_stddev"
    return field


def _pool_fields(workload: Workload) -> str:
    """The setting(s) that size the KV pool the fit checks read: ``engine.num_blocks`` or
    ``engine.kv_cache_memory``; with ``engine.disagg``, each pool's own size where it gives one
    (the facts' pool is the smaller of the two pools)."""
    engine = workload.engine
    base = "engine." + ("num_blocks" if engine.num_blocks is not None else "kv_cache_memory")
    if engine.disagg is None:
        return base
    fields = []
    for role in ("prefill", "decode"):
        own = [k for k in ("num_blocks", "kv_cache_memory") if getattr(getattr(engine.disagg, role), k) is not None]
        fields.append(f"engine.disagg.{role}.{own[0]}" if own else base)
    return " or ".join(dict.fromkeys(fields))


def check_shortest_fits(workload: Workload, engine: EngineFacts) -> None:
    """Before sampling: refuse a bucket whose shortest request (its classes' ``input_tokens`` +
    ``output_tokens`` minimums; a shared prefix or a history only adds) needs more blocks than the
    pool holds, so that 10^7-token prompts are never drawn only to be refused. Fixed lengths get
    :func:`check_requests_fit`'s line word for word (their shortest request is the longest).

    Raises:
        KvplanError: ``buckets[i].<input_tokens or output_tokens, the larger>``, as
            :func:`check_requests_fit`.
    """
    if workload.dataset.kind == "trace":
        return  # lengths from the trace, checked once read
    for index, bucket in enumerate(workload.buckets):
        sides = [(c.input_tokens, c.output_tokens) for c in bucket.classes]
        c = min(range(len(sides)), key=lambda k: sides[k][0].min + sides[k][1].min)
        (inp, out), at = sides[c], f"buckets[{index}]."
        blocks = -(-(inp.min + out.min - 1) // engine.block_size)
        if blocks > engine.num_blocks:
            side = "input_tokens" if inp.min >= out.min else "output_tokens"
            which = "longest" if (inp.min, out.min) == (inp.max, out.max) and len(sides) == 1 else "shortest"
            raise KvplanError(
                at + bucket.class_field(c, side),
                f"the {which} request ({inp.min} + {out.min} tokens) needs {blocks} blocks of"
                f" {engine.block_size} tokens, the KV pool has {engine.num_blocks}",
                f"lower it or grow {_pool_fields(workload)}",
                source=workload.source,
            )


def fit_check(workload: Workload, engine: EngineFacts) -> Callable[[str, SampledRequest], None]:
    """:func:`check_requests_fit` of one request of the named bucket: what sampling calls with a
    bucket's longest drawn length before it draws the prompts' ids
    (kvplan.traffic.prompts.LengthCheck), so that an AIPerf stddev of 10^8 tokens is refused in
    milliseconds, not after drawing prompts of 16 M ids. Its line is check_requests_fit's.
    """
    return lambda name, request: check_requests_fit(workload, engine, {name: [request]})


def check_requests_fit(workload: Workload, engine: EngineFacts, sampled: dict[str, list[SampledRequest]]) -> None:
    """Refuse a bucket with a sampled request the engine could never run (see the module's
    formulas). ``engine``: its ``block_size``, ``num_blocks``, ``max_model_len``.

    Raises:
        KvplanError: ``<workload>: buckets[i].<field>: the longest request (200 + 12 tokens) needs
            53 blocks of 4 tokens, the KV pool has 48; lower it or grow engine.num_blocks``, the
            field being whichever of input_tokens, output_tokens or shared_prefix.num_tokens
            gives the request most tokens; or the same for max_model_len.
    """
    pool_field = _pool_fields(workload)
    for index, bucket in enumerate(workload.buckets):
        requests = sampled.get(bucket.name) or []
        if not requests:
            continue
        longest = max(requests, key=lambda r: r.num_tokens)  # most tokens is most blocks
        field, spelled = _longest_part(index, bucket, longest)
        where = _stddev_field(index, bucket, field, engine)
        blocks = -(-(longest.num_tokens - 1) // engine.block_size)
        if blocks > engine.num_blocks:
            raise KvplanError(
                where,
                f"the longest request ({spelled} tokens) needs {blocks} blocks of"
                f" {engine.block_size} tokens, the KV pool has {engine.num_blocks}",
                f"lower it or grow {pool_field}",
                source=workload.source,
            )
        if longest.num_tokens > engine.max_model_len:
            limit = (
                f"engine.max_model_len {engine.max_model_len}"
                if workload.engine.max_model_len is not None
                else f"the engine's max_model_len {engine.max_model_len} (by default the smaller of the KV"
                " pool's tokens and the model's max_position_embeddings)"
            )
            pool_tokens = engine.num_blocks * engine.block_size
            model_bound = workload.engine.max_model_len is None and engine.max_model_len < pool_tokens
            raise KvplanError(
                where,
                f"the longest request ({spelled} = {longest.num_tokens} tokens) exceeds {limit}",
                # the model's own limit binds: no engine setting raises it
                f"lower it: the model takes at most {engine.max_model_len} tokens"
                if model_bound
                else "lower it or raise engine.max_model_len",
                source=workload.source,
            )
