"""Attention data parallelism by hand: the busiest DP rank's share of a step, the step time of
an instance (its slowest rank's), the weights on each GPU, the roofline's experts over tp x dp
GPUs, and the KV capacity of a dp instance (dp x one rank's pool)."""

import pytest

from kvplan.errors import KvplanError
from kvplan.run.sim.cost import StepWork
from kvplan.sizing.gpus.data_parallel import (
    DataParallelStepCost,
    RankWork,
    busiest_rank,
    check_dp,
    check_ep,
    rank_weights_bytes,
)
from kvplan.sizing.gpus.step_cost import roofline
from kvplan.sizing.models.model_spec import ModelSpec
from tests.kvplan.sizing.test_step_cost import TINY
from tests.kvplan.sizing.test_step_cost_moe import ALL_WEIGHTS, EXPERT, FIT, GPU, MOE


def test_a_batch_of_8_decodes_over_4_ranks_prices_a_rank_of_2():
    work = StepWork(0, 8, 0, 8 * 1000, 8 * 1000, 8 * 1000)
    assert busiest_rank(work, 4) == RankWork(0, 2, 0, 2000, 2000, 2000)
    # 5 decodes over 4 ranks: one rank gets 2 (whole sequences), at the mean context 1,000
    assert busiest_rank(StepWork(0, 5, 0, 5000, 5000, 5000), 4) == RankWork(0, 2, 0, 2000, 2000, 2000)
    assert busiest_rank(work, 1) is work


def test_prefill_tokens_spread_as_chunked_prefill_allows():
    # 3 chunks of 1,000 new tokens (500 cached each) and 4 decodes at 100 context, over 2 ranks:
    # the busiest rank computes half the 3,000 prefill tokens (each rank's scheduler chunks its
    # prompts to its own budget) in 2 chunks, with half the cached context and pairs, and 2 decodes
    pairs_prefill = 3 * (500 * 1000 + 1000 * 1001 // 2)
    work = StepWork(3000, 4, 3, 3 * 1500 + 400, pairs_prefill + 400, 400)
    rank = busiest_rank(work, 2)
    assert (rank.num_prefill_tokens, rank.num_prefill_seqs, rank.num_decode_tokens) == (1500, 2, 2)
    assert rank.num_context_tokens == 4500 // 2 + 200
    assert rank.num_decode_context_tokens == 200
    assert rank.num_attended_tokens == -(-pairs_prefill // 2) + 200
    # 2 prompts of 4,096 over 4 ranks: fewer chunks than ranks, each whole on its own rank
    two = busiest_rank(StepWork(8192, 0, 2, 8192, 2 * 4096 * 4097 // 2, 0), 4)
    assert (two.num_prefill_tokens, two.num_prefill_seqs, two.num_context_tokens) == (4096, 1, 4096)


class _Recorder:
    """A cost model that charges 1 ms per decode and 0.01 ms per prefill token, recording what it priced."""

    gap_s = 0.002

    def __init__(self):
        self.seen = []

    def step_seconds(self, work):
        self.seen.append(work)
        return 1e-3 * work.num_decode_tokens + 1e-5 * work.num_prefill_tokens


def test_an_instance_step_lasts_as_long_as_its_busiest_rank():
    rank = _Recorder()
    cost = DataParallelStepCost(rank, 4)
    # 8 decodes over 4 ranks: 2 each, 2 ms (not 8 ms as one batch of 8 would be)
    assert cost.step_seconds(StepWork(0, 8, 0, 8000, 8000, 8000)) == pytest.approx(2e-3)
    assert rank.seen[-1].num_decode_tokens == 2
    # 9 decodes: one rank has 3, the others wait for it: 3 ms
    assert cost.step_seconds(StepWork(0, 9, 0, 9000, 9000, 9000)) == pytest.approx(3e-3)
    # one 4,096-token prompt is one rank's, whole: 40.96 ms however many ranks there are
    assert cost.step_seconds(StepWork(4096, 0, 1, 4096, 4096 * 4097 // 2, 0)) == pytest.approx(0.04096)
    assert cost.gap_s == 0.002


def test_the_weights_on_each_gpu_split_experts_over_tp_x_dp():
    spec = ModelSpec.from_hf_config(MOE, "tiny-moe")
    routed = 2 * 8 * EXPERT * 2  # 2 MoE layers x 8 experts x bf16
    assert rank_weights_bytes(spec, "auto", 1, 1) == ALL_WEIGHTS
    assert rank_weights_bytes(spec, "auto", 1, 4) == int(ALL_WEIGHTS - routed + routed / 4)
    assert rank_weights_bytes(spec, "auto", 2, 4) == int((ALL_WEIGHTS - routed) / 2 + routed / 8)


def test_the_roofline_of_a_rank_reads_its_share_of_experts_hit_by_every_ranks_tokens():
    spec = ModelSpec.from_hf_config(MOE, "tiny-moe")
    one, four = roofline(spec, GPU, FIT, 1), roofline(spec, GPU, FIT, 1, dp=4)
    assert four.expert_bytes == pytest.approx(EXPERT * 2 / 4)
    assert four.flops_per_token == one.flops_per_token  # dp x the tokens over dp x the GPUs
    # 3 tokens on the rank: D(12) = 8 x (1 - (6/8)^12) experts hit per MoE layer by the 4 ranks' 12 tokens
    work = StepWork(0, 3, 0, 30, 30, 30)
    hit = 8 * (1 - (6 / 8) ** 12)
    moved_four = four.weight_bytes + four.kv_bytes_per_token * 33 + four.activation_bytes_per_token * 3
    assert four.parts(work)["memory_s"] == pytest.approx((moved_four + 2 * hit * EXPERT * 2 / 4) / 1e9)
    # dispatch and combine: 2 x 2 MoE layers x top-2 x 64 hidden x 2 bytes, 3/4 leaving the GPU, per token
    assert four.link_bytes_per_token == pytest.approx(2 * 2 * 2 * 64 * 2 * 3 / 4)
    assert four.num_allreduces == 4 and one.num_allreduces == 0


def test_dp_a_model_cannot_use_is_refused():
    dense = ModelSpec.from_hf_config(TINY, "tiny-dense")
    moe = ModelSpec.from_hf_config(MOE, "tiny-moe")
    with pytest.raises(KvplanError, match="must be >= 1 \\(got 0\\)") as err:
        check_dp(moe, 1, 0)
    assert err.value.field == "dp"
    with pytest.raises(KvplanError, match="tiny-dense has no experts for its 2 DP ranks") as err:
        check_dp(dense, 1, 2)
    check_dp(moe, 2, 4)  # fine
    check_dp(dense, 4, 1)
    with pytest.raises(KvplanError, match="must divide tp x dp = 4 \\(got 3\\)"):
        check_ep(moe, 2, 3, 2)
    check_ep(moe, 1, 8, 8)  # ep 8 over tp 1 x dp 8


def test_a_dp_instance_holds_dp_times_one_ranks_pool_and_limits(tmp_path):
    from kvplan.run.sim.gpu_target import gpu_setup
    from kvplan.sizing.capacity import GiB, estimate_capacity
    from kvplan.sizing.models.model_source import load_model_config
    from kvplan.workload.file import parse_workload

    workload = parse_workload(
        {
            "name": "dp",
            "engine": {"model": "tiny-random-llama", "max_num_seqs": 16, "max_num_batched_tokens": 2048},
            "dataset": {"kind": "random"},
            "buckets": [{"name": "b", "input_tokens": 64, "output_tokens": 8, "concurrency": [2], "num_requests": 4}],
        }
    )
    spec = ModelSpec.from_hf_config(*load_model_config("qwen3-30b-a3b")[:2])
    one = gpu_setup(workload, "qwen3-30b-a3b", "H100-SXM", 1, step_times="roofline")
    two = gpu_setup(workload, "qwen3-30b-a3b", "H100-SXM", 1, step_times="roofline", dp=2, ep=2)
    rank = estimate_capacity(
        spec,
        tp=1,
        gpu="H100-SXM",
        block_size=workload.engine.block_size,
        max_model_len=workload.engine.max_model_len,
        weights_gib=rank_weights_bytes(spec, "auto", 1, 2) / GiB,
    )
    assert two.facts.num_blocks == 2 * rank.num_blocks
    assert rank.num_blocks > one.facts.num_blocks  # half the experts per GPU leave more for KV
    assert (two.facts.max_num_seqs, two.facts.max_num_batched_tokens) == (32, 4096)
    assert (one.facts.max_num_seqs, one.facts.max_num_batched_tokens) == (16, 2048)
    assert two.dp == 2 and two.facts.device == "H100-SXM x2 (tp 1 x dp 2)"
    assert two.cost_model.parameters["dp"] == 2
