"""ModelRunner with hand-built SchedulerOutputs (block_size 4): the batch layout, slot mapping and
block tables worked out by hand, and logits equal to transformers' forward on the full context."""

from __future__ import annotations

import pytest
import torch

from engine.attention import torch_ref
from engine.kv_cache import KVCache
from engine.model_runner import ModelRunner
from engine.models.llama import Transformer
from engine.outputs import ScheduledRequest, SchedulerOutput
from tests.engine.tiny import random_prompts, tiny_hf_model

A, B, C = random_prompts((10, 6, 1))
A_NEXT = 77  # A's next token in step 2 (any id works: the reference sees the same one)


def sched(*scheduled: ScheduledRequest) -> SchedulerOutput:
    return SchedulerOutput(scheduled=scheduled, num_prefill_tokens=0, num_decode_tokens=0)


# Step 1: A prefills all 10 tokens into blocks 7, 2, 5; B prefills a 4-token chunk into block 3
# (no logits needed); C's 1-token prompt goes to block 0 and, being one token, is laid out first.
STEP1 = sched(
    ScheduledRequest("A", tuple(A), 0, (7, 2, 5), sample=True),
    ScheduledRequest("B", tuple(B[:4]), 0, (3,), sample=False),
    ScheduledRequest("C", tuple(C), 0, (0,), sample=True),
)
# Step 2: B's last 2 prompt tokens go to a new block 6; A decodes its 11th token (position 10).
STEP2 = sched(
    ScheduledRequest("B", tuple(B[4:]), 4, (3, 6), sample=True),
    ScheduledRequest("A", (A_NEXT,), 10, (7, 2, 5), sample=True),
)


@pytest.fixture(scope="module")
def hf():
    return tiny_hf_model()


def make_runner(hf) -> ModelRunner:
    cfg = hf.config
    cache = KVCache(
        cfg.num_hidden_layers,
        cfg.num_key_value_heads,
        cfg.head_dim,
        4,
        torch.float32,
        torch.device("cpu"),
        num_blocks=8,
    )
    return ModelRunner(Transformer.from_hf(hf, torch_ref), cache, torch.device("cpu"))


def test_prepare_lays_out_decodes_first_with_hand_computed_slots(hf):
    inp = make_runner(hf).prepare(STEP1)
    assert inp.input_ids.tolist() == C + A + B[:4]
    assert inp.positions.tolist() == [0, *range(10), *range(4)]
    # slot = block_ids[p // 4] * 4 + p % 4
    # C: block 0 -> 0 | A: block 7 -> 28..31, block 2 -> 8..11, block 5 -> 20, 21 | B: block 3 -> 12..15
    assert inp.meta.slot_mapping.tolist() == [0, 28, 29, 30, 31, 8, 9, 10, 11, 20, 21, 12, 13, 14, 15]
    assert inp.meta.query_start_loc.tolist() == [0, 1, 11, 15]
    assert inp.meta.seq_lens.tolist() == [1, 10, 4]
    assert inp.meta.block_tables.tolist() == [[0, 0, 0], [7, 2, 5], [3, 0, 0]]
    assert inp.meta.block_tables.dtype == torch.int32 and inp.meta.slot_mapping.dtype == torch.int64
    assert (inp.meta.num_decodes, inp.meta.max_query_len, inp.meta.max_seq_len) == (1, 10, 10)
    assert inp.sample_indices.tolist() == [0, 10]  # last token of C, last token of A; B not sampled
    assert inp.sampled_request_ids == ("C", "A")

    inp2 = make_runner(hf).prepare(STEP2)
    assert inp2.input_ids.tolist() == [A_NEXT, *B[4:]]
    assert inp2.positions.tolist() == [10, 4, 5]
    assert inp2.meta.slot_mapping.tolist() == [22, 24, 25]  # A: block 5 offset 2; B: block 6 offsets 0, 1
    assert inp2.meta.block_tables.tolist() == [[7, 2, 5], [3, 6, 0]]
    assert inp2.meta.seq_lens.tolist() == [11, 6]
    assert inp2.sample_indices.tolist() == [0, 2] and inp2.sampled_request_ids == ("A", "B")


@torch.inference_mode()
def test_execute_two_steps_matches_transformers_forward(hf):
    runner = make_runner(hf)

    def last_logits(ids):
        return hf(torch.tensor([ids])).logits[0, -1].float()

    out1 = runner.execute(STEP1)
    assert out1.request_ids == ("C", "A") and out1.logits.shape == (2, 512)
    assert out1.logits.dtype == torch.float32
    torch.testing.assert_close(out1.logits[0], last_logits(C), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out1.logits[1], last_logits(A), rtol=1e-5, atol=1e-5)

    out2 = runner.execute(STEP2)  # reads step 1's K/V from blocks 7, 2, 5 and 3
    assert out2.request_ids == ("A", "B")
    torch.testing.assert_close(out2.logits[0], last_logits(A + [A_NEXT]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out2.logits[1], last_logits(B), rtol=1e-5, atol=1e-5)


def test_prepare_rejects_a_short_block_table_and_an_empty_step(hf):
    runner = make_runner(hf)
    with pytest.raises(ValueError, match="2 blocks of 4 cannot hold 10 tokens"):
        runner.prepare(sched(ScheduledRequest("A", tuple(A), 0, (7, 2), sample=True)))
    with pytest.raises(ValueError, match="nothing scheduled"):
        runner.prepare(sched())
