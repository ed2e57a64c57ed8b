"""AttentionMetadata: where one step's tokens live in the paged cache (both backends read it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    """Where this step's tokens live in the paged cache. All tensors on the model's device.

    slot_mapping: [num_tokens] int64, cache slot of each scheduled token.
    query_start_loc: [num_seqs + 1] int32, offsets of each sequence's new tokens in the batch.
    seq_lens: [num_seqs] int32, context length of each sequence after this step (tokens).
    block_tables: [num_seqs, max_num_blocks_per_seq] int32, padded with 0 past each table's end.
    num_decodes: the first ``num_decodes`` sequences have exactly one new token each.
    max_query_len, max_seq_len: host-side maxima (no device sync needed to size a launch).
    backend_plans: a backend's own per-step plan, derived from the fields above and built once
        by the first layer that needs it (keyed by backend and block size); the runner makes a
        new metadata object each step, so a plan never outlives its step.
    """

    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    num_decodes: int
    max_query_len: int
    max_seq_len: int
    backend_plans: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])
