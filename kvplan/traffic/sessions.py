"""Multi-turn sessions (``dataset.sessions``, kvplan.workload.sessions): each of a bucket's
``num_requests`` becomes a session of turns, each turn one SampledRequest.

Turn k's prompt is the chat history of turns 1..k-1 (the human messages and the *recorded*
replies, never generated text, so every token id is known before the run and ``kvplan simulate``
sends the very same prompts) plus human message k and the assistant's generation prompt; its
``max_tokens`` is the recorded reply's token length. Token ids are concatenated from separately
tokenised pieces, so each turn's prompt extends the one before exactly::

    turn 1:  | start | U h1 E A |
    turn 2:  | start | U h1 E A | r1 E | U h2 E A |       start = system message,
    turn 3:  | turn 2's prompt        | r2 E | U h3 E A |      U / E / A = user open / end / assistant open

and each turn's output is its recorded reply (``SampledRequest.reply_token_ids``, emitted by the
engine and the simulator alike through engine.request.SamplingParams.forced_token_ids, as a chat
client resends the server's own reply), so with prefix caching (same cache salt: a level's own)
turn k hits every full block of turn k-1's prompt and reply (all but the reply's last token, which
was sampled and never computed). The template is SmolLM2-135M-Instruct's,
as its GGUF's ``tokenizer.chat_template`` writes it: ChatML with a default system message when
the conversation has none (ShareGPT's have none)::

    <|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n
    <|im_start|>user\\n{human}<|im_end|>\\n<|im_start|>assistant\\n{reply}<|im_end|>\\n ...

used in that ChatML form for every model. What the tokenizer adds to any text (``tokenize([""])``,
a BOS for some models, nothing for SmolLM2) is stripped from each piece and put once in front.

- ShareGPT: a conversation's alternation human, reply, human, reply ... from its first human
  message (turn 1 is the pair ``sharegpt_pairs`` takes). A bucket keeps its turns while each human
  message's own tokens fit ``input_tokens`` and each reply's fit ``output_tokens``, up to
  ``max_turns``; a conversation whose first turn does not fit is passed over. Conversations are
  walked in one seeded order, each bucket taking the first ``num_requests`` sessions.
- random: every session has exactly ``max_turns`` turns of random token ids in [0, vocab_size),
  each message's length drawn from the bucket's range (as random prompts are), with no template
  pieces (a random model has no chat template): turn k's prompt is h1 r1 ... h(k-1) r(k-1) hk.

Think times (the pause before turns 2..n, seconds) are drawn uniformly in ``think_time_s`` per
turn, session by session, from a generator seeded by the workload's seed and the bucket's index.
Everything is deterministic for the workload's seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kvplan.errors import KvplanError
from kvplan.traffic.requests import SampledBuckets, SampledRequest, Tokenize
from kvplan.workload.buckets import Bucket, Lengths
from kvplan.workload.schema import Workload
from kvplan.workload.sessions import Sessions

# kvplan.traffic.prompts passes its ShareGPT reader and length draws (it imports this module)
ReadRecords = Callable[[], list[dict]]
DrawLengths = Callable[[Lengths, int, np.random.Generator], np.ndarray]

_STREAM = 0x5E55  # seeds the session draws apart from the prompt and prefix draws
_ORDER, _RANDOM, _THINK = 1, 2, 3
_BATCH = 64  # conversations tokenised at a time

# SmolLM2-135M-Instruct's chat template, piece by piece (see the module docstring)
SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
USER, ASSISTANT, END = "<|im_start|>user\n", "<|im_start|>assistant\n", "<|im_end|>\n"


@dataclass(frozen=True)
class Template:
    """The chat template's pieces as token ids: ``start`` (what the tokenizer adds, then the system
    message), ``user`` (opens a human message), ``end`` (ends any message), ``assistant`` (the
    generation prompt); ``added``: the ids the tokenizer puts around any text, stripped from every
    piece and message."""

    start: tuple[int, ...] = ()
    user: tuple[int, ...] = ()
    end: tuple[int, ...] = ()
    assistant: tuple[int, ...] = ()
    added: tuple[int, ...] = ()

    @classmethod
    def of(cls, tokenize: Tokenize) -> Template:
        added, system, user, end, assistant = (tuple(ids) for ids in tokenize(["", SYSTEM, USER, END, ASSISTANT]))
        plain = cls(added=added)
        return cls(added + plain.strip(system), plain.strip(user), plain.strip(end), plain.strip(assistant), added)

    def strip(self, ids: Sequence[int]) -> tuple[int, ...]:
        """``ids`` without the tokenizer's added leading ids."""
        ids = tuple(ids)
        return ids[len(self.added) :] if self.added and ids[: len(self.added)] == self.added else ids


Turns = list[tuple[tuple[int, ...], tuple[int, ...]]]  # per turn: (human message ids, reply ids)


def session_requests(
    template: Template, turns: Turns, think_s: Sequence[float], session: int, source: str
) -> list[SampledRequest]:
    """One session's turns as requests: turn k's prompt = turn k-1's prompt + its reply + ``end``
    + ``user`` + human k + ``end`` + ``assistant``; ``max_tokens`` = reply k's length;
    ``think_s[k]``: the pause before turn k + 1 (0 for the first)."""
    history, out = template.start, []
    for k, (human, reply) in enumerate(turns):
        prompt = history + template.user + human + template.end + template.assistant
        out.append(
            SampledRequest(
                prompt,
                len(reply),
                source,
                session=session,
                turn=k + 1,
                think_time_s=think_s[k],
                reply_token_ids=tuple(reply),
            )
        )
        history = prompt + reply + template.end
    return out


def _thinker(spec: Sessions, seed: int, index: int) -> Callable[[int], list[float]]:
    """Bucket ``index``'s think times: called once per session, in order, with its turn count."""
    rng = np.random.default_rng([seed, _STREAM, _THINK, index])
    lo, hi = spec.think_range

    def draw(num_turns: int) -> list[float]:
        return [0.0, *(float(t) for t in rng.uniform(lo, hi, size=num_turns - 1))]

    return draw


def _lengths(bucket: Bucket) -> tuple[Lengths, Lengths]:
    assert bucket.input_tokens is not None and bucket.output_tokens is not None  # sessions refuse a mix
    return bucket.input_tokens, bucket.output_tokens


def _random_sessions(
    bucket: Bucket, index: int, spec: Sessions, seed: int, vocab_size: int, draw: DrawLengths
) -> list[SampledRequest]:
    rng = np.random.default_rng([seed, _STREAM, _RANDOM, index])
    inputs, outputs = _lengths(bucket)
    count = bucket.num_requests * spec.max_turns
    humans, replies = draw(inputs, count, rng), draw(outputs, count, rng)
    think, out = _thinker(spec, seed, index), []
    ids = lambda n: tuple(int(t) for t in rng.integers(0, vocab_size, size=int(n)))  # noqa: E731
    for s in range(bucket.num_requests):
        span = range(s * spec.max_turns, (s + 1) * spec.max_turns)
        turns = [(ids(humans[j]), ids(replies[j])) for j in span]
        out += session_requests(Template(), turns, think(len(turns)), s, "random")
    return out


def conversation_turns(record: dict) -> list[tuple[str, str]]:
    """(human message, reply) pairs of a ShareGPT record from its first human message on, while
    human and reply (any other speaker) alternate with text."""
    messages = record.get("conversations") or []
    i = next((j for j, m in enumerate(messages) if m.get("from") == "human"), len(messages))
    pairs = []
    while i + 1 < len(messages):
        human, reply = messages[i], messages[i + 1]
        texts = (human.get("value"), reply.get("value"))
        if (
            human.get("from") != "human"
            or reply.get("from") == "human"
            or not all(isinstance(t, str) and t for t in texts)
        ):
            break
        pairs.append((human["value"], reply["value"]))
        i += 2
    return pairs


def _fitting(turns: Turns, bucket: Bucket) -> Turns:
    """The leading turns whose human message and reply fit the bucket's ranges."""
    inputs, outputs = _lengths(bucket)
    kept = []
    for human, reply in turns:
        if not (inputs.min <= len(human) <= inputs.max and outputs.min <= len(reply) <= outputs.max):
            break
        kept.append((human, reply))
    return kept


def _sharegpt_sessions(workload: Workload, records: list[dict], tokenize: Tokenize) -> dict[str, list[SampledRequest]]:
    spec, buckets = workload.dataset.sessions, workload.buckets
    assert spec is not None  # called for a sessions workload only
    template = Template.of(tokenize)
    conversations = [(i, turns[: spec.max_turns]) for i, r in enumerate(records) if (turns := conversation_turns(r))]
    order = np.random.default_rng([workload.seed, _STREAM, _ORDER]).permutation(len(conversations))
    chosen: dict[str, list[tuple[int, Turns]]] = {b.name: [] for b in buckets}
    for start in range(0, len(order), _BATCH):
        if all(len(chosen[b.name]) >= b.num_requests for b in buckets):
            break
        batch = [conversations[j] for j in order[start : start + _BATCH]]
        ids = iter(tokenize([text for _, turns in batch for pair in turns for text in pair]))
        for record, texts in batch:
            tokens = [(template.strip(next(ids)), template.strip(next(ids))) for _ in texts]
            for bucket in buckets:
                if len(chosen[bucket.name]) < bucket.num_requests and (kept := _fitting(tokens, bucket)):
                    chosen[bucket.name].append((record, kept))
    out = {}
    for i, bucket in enumerate(buckets):
        found = chosen[bucket.name]
        if len(found) < bucket.num_requests:
            inputs, outputs = _lengths(bucket)
            raise KvplanError(
                f"buckets[{i}]",
                f"only {len(found)} of {bucket.num_requests} ShareGPT conversations open with a human turn that"
                f" fits input_tokens [{inputs.min}, {inputs.max}] and a reply that fits output_tokens"
                f" [{outputs.min}, {outputs.max}]",
                "widen the ranges or lower num_requests",
                source=workload.source,
            )
        think = _thinker(spec, workload.seed, i)
        out[bucket.name] = [
            request
            for s, (record, turns) in enumerate(found)
            for request in session_requests(template, turns, think(len(turns)), s, f"sharegpt:{record}")
        ]
    return out


def sample_sessions(
    workload: Workload, tokenize: Tokenize | None, vocab_size: int, read_records: ReadRecords, draw: DrawLengths
) -> SampledBuckets:
    """Every bucket's sessions, turn by turn (session 0's turns, then session 1's, ...),
    deterministic for ``workload.seed`` (see the module docstring). ``read_records``: ShareGPT's
    records (kvplan.traffic.prompts.read_sharegpt); ``draw``: random lengths from a range
    (kvplan.traffic.prompts.draw_lengths).

    Raises:
        KvplanError: too few ShareGPT conversations whose first turn fits a bucket's ranges, or
            ShareGPT with no tokenizer.
    """
    spec = workload.dataset.sessions
    assert spec is not None  # called for a sessions workload only
    kind = workload.dataset.kind
    settings = spec.model_dump(mode="json")
    if kind == "random":
        requests = {
            b.name: _random_sessions(b, i, spec, workload.seed, vocab_size, draw)
            for i, b in enumerate(workload.buckets)
        }
        info: dict[str, object] = {"kind": kind, "vocab_size": vocab_size, "sessions": {**settings, "template": None}}
        return SampledBuckets(requests, info)
    if tokenize is None:
        raise KvplanError(
            "dataset", "sharegpt sessions need a tokenizer and the model has none", source=workload.source
        )
    records = read_records()
    requests = _sharegpt_sessions(workload, records, tokenize)
    info = {
        "kind": kind,
        "num_conversations": len(records),
        "sessions": {**settings, "template": "ChatML (SmolLM2-135M-Instruct's chat_template)"},
    }
    return SampledBuckets(requests, info)
