"""ModelRunner: one SchedulerOutput -> the step's tensors -> logits of the rows to sample.

The runner owns the step's tensors and never changes scheduler state. It lays the batch out as
``engine.attention`` requires, single-token sequences (decodes) first, then the rest::

    scheduled:      A: decode 1 tok   B: prefill chunk 4 tok   C: decode 1 tok
    batch order:    A  C  B                                     (stable within each group)
    input_ids:      | a | c | b b b b |
    positions:      | 9 | 5 | 0 1 2 3 |         num_computed_tokens + j
    slot_mapping:   block_ids[p // block_size] * block_size + p % block_size
    query_start_loc: 0   1   2         6
    sample rows:    query_start_loc[i + 1] - 1 for each sequence with sample=True

Only the sampled rows go through the final norm and the lm_head: [num_sampled, vocab] fp32,
plus the rows of any prompt positions a request asked logits for (``prompt_logits_positions``),
returned per request as ``PromptLogits``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention import AttentionMetadata
from engine.kv_cache import KVCache
from engine.models.llama import Transformer
from engine.outputs import SchedulerOutput


@dataclass(frozen=True)
class ModelInput:
    """One step's device tensors.

    input_ids, positions: [num_tokens] int64. sample_indices: [num_sampled] int64 rows of the
    batch whose logits are needed; sampled_request_ids names them in the same order.
    prompt_logits_indices: [sum of spans' counts] int64 rows of requested prompt positions;
    prompt_logits_spans: (request_id, first position, count) for each request, in row order.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_indices: torch.Tensor
    sampled_request_ids: tuple[str, ...]
    prompt_logits_indices: torch.Tensor | None = None
    prompt_logits_spans: tuple[tuple[str, int, int], ...] = ()


@dataclass(frozen=True)
class PromptLogits:
    """One request's requested prompt logits from one step: logits [n, vocab_size] fp32, row i the
    next-token logits at prompt position ``first_position + i``."""

    request_id: str
    first_position: int
    logits: torch.Tensor


@dataclass(frozen=True)
class RunnerOutput:
    """logits: [num_sampled, vocab_size] fp32, row i for ``request_ids[i]``; prompt_logits: the
    requested prompt positions computed this step (chunked prefill spreads them over steps)."""

    request_ids: tuple[str, ...]
    logits: torch.Tensor
    prompt_logits: tuple[PromptLogits, ...] = ()


class ModelRunner:
    """Runs ``model`` over a SchedulerOutput, reading and writing ``kv_cache``."""

    def __init__(self, model: Transformer, kv_cache: KVCache, device: torch.device):
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.device = device

    def prepare(self, output: SchedulerOutput) -> ModelInput:
        """Build the step's tensors (host lists -> one tensor each -> device).

        Raises:
            ValueError: an empty SchedulerOutput, or a block table too short for its tokens.
        """
        if output.is_empty:
            raise ValueError("scheduler output: nothing scheduled")
        bs = self.block_size
        ordered = sorted(output.scheduled, key=lambda s: s.num_new_tokens != 1)  # stable: decodes first
        num_decodes = sum(1 for s in ordered if s.num_new_tokens == 1)
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start_loc = [0]
        seq_lens: list[int] = []
        sample_indices: list[int] = []
        sampled_ids: list[str] = []
        prompt_rows: list[int] = []
        prompt_spans: list[tuple[str, int, int]] = []
        max_blocks = max(len(s.block_ids) for s in ordered)
        block_tables: list[tuple[int, ...]] = []
        for s in ordered:
            if len(s.block_ids) * bs < s.seq_len:
                raise ValueError(
                    f"scheduled {s.request_id!r}: {len(s.block_ids)} blocks of {bs} cannot hold {s.seq_len} tokens"
                )
            first_row = len(input_ids)
            input_ids.extend(s.token_ids)
            span = range(s.num_computed_tokens, s.seq_len)
            wanted = range(
                max(span.start, s.prompt_logits_positions.start), min(span.stop, s.prompt_logits_positions.stop)
            )
            if wanted:
                prompt_rows.extend(first_row + p - span.start for p in wanted)
                prompt_spans.append((s.request_id, wanted.start, len(wanted)))
            positions.extend(span)
            table = s.block_ids
            slots.extend([table[p // bs] * bs + p % bs for p in span])
            query_start_loc.append(len(input_ids))
            seq_lens.append(s.seq_len)
            block_tables.append(table + (0,) * (max_blocks - len(table)))
            if s.sample:
                sample_indices.append(len(input_ids) - 1)
                sampled_ids.append(s.request_id)

        def tensor(values, dtype):
            return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

        meta = AttentionMetadata(
            slot_mapping=tensor(slots, torch.int64),
            query_start_loc=tensor(query_start_loc, torch.int32),
            seq_lens=tensor(seq_lens, torch.int32),
            block_tables=tensor(block_tables, torch.int32),
            num_decodes=num_decodes,
            max_query_len=max(s.num_new_tokens for s in ordered),
            max_seq_len=max(seq_lens),
        )
        return ModelInput(
            input_ids=tensor(input_ids, torch.int64),
            positions=tensor(positions, torch.int64),
            meta=meta,
            sample_indices=tensor(sample_indices, torch.int64),
            sampled_request_ids=tuple(sampled_ids),
            prompt_logits_indices=tensor(prompt_rows, torch.int64) if prompt_rows else None,
            prompt_logits_spans=tuple(prompt_spans),
        )

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput) -> RunnerOutput:
        """Forward pass for one step; K/V of every scheduled token land in the cache.

        Returns logits for the sequences with ``sample=True``, in batch order (decodes first), and
        for the requested prompt positions of this step's chunks.
        """
        inp = self.prepare(output)
        hidden = self.model(inp.input_ids, inp.positions, self.kv_cache, inp.meta)
        logits = self.model.compute_logits(hidden[inp.sample_indices])
        prompt_logits: tuple[PromptLogits, ...] = ()
        if inp.prompt_logits_indices is not None:
            rows = self.model.compute_logits(hidden[inp.prompt_logits_indices])
            parts = rows.split([n for _, _, n in inp.prompt_logits_spans])
            prompt_logits = tuple(
                PromptLogits(rid, first, part) for (rid, first, _), part in zip(inp.prompt_logits_spans, parts)
            )
        return RunnerOutput(inp.sampled_request_ids, logits, prompt_logits)
