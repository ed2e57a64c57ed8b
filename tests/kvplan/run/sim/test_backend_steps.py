"""How a GPU target's backend forms its steps: ``--backend sglang`` computes prefill steps apart from
decode steps (engine.config's prefill_first, SGLang's default scheduling), vLLM and TensorRT-LLM
mix decodes with prefill chunks. Checked on the simulated steps themselves, with the roofline's
step times (no database needed), against hand arithmetic of a burst of equal requests."""

import math

import pytest

from kvplan.results.run_result import load_run
from kvplan.run.sim.gpu_target import gpu_setup
from kvplan.run.sim.run import simulate
from kvplan.workload.file import parse_workload

USERS, ISL, OSL, BUDGET = 8, 1024, 16, 2048


def burst():
    """8 users of 1,024-token prompts and 16 output tokens, a 2,048-token step budget."""
    return parse_workload(
        {
            "name": "backend-steps",
            "engine": {"model": "tiny-random-llama", "max_num_batched_tokens": BUDGET, "max_model_len": 2048},
            "dataset": {"kind": "random"},
            "buckets": [
                {
                    "name": "b",
                    "input_tokens": ISL,
                    "output_tokens": OSL,
                    "concurrency": [USERS],
                    "num_requests": USERS,
                }
            ],
        }
    )


@pytest.mark.parametrize("backend", ["vllm", "trtllm", "sglang"])
def test_the_backend_decides_whether_prefills_and_decodes_share_a_step(backend, tmp_path):
    workload = burst()
    setup = gpu_setup(workload, "llama-3.1-8b", "H100-SXM", backend=backend, step_times="roofline")
    run = load_run(simulate(workload, setup, tmp_path / "run", search=False))
    assert len(run.requests) == USERS and {r.num_output_tokens for r in run.requests} == {OSL}
    steps = run.steps
    assert setup.facts.prefill_first == (backend == "sglang")
    prefill_steps = [s for s in steps if s.num_prefill_tokens]
    # 8 x 1,024 prompt tokens in steps of at most 2,048: 4 steps hold every prompt token
    assert sum(s.num_prefill_tokens for s in prefill_steps) == USERS * ISL
    mixed = [s for s in prefill_steps if s.num_decode_tokens]
    if backend == "sglang":
        # prefill first: the 4 prompt steps run back to back, no decode among them; then 15 decode
        # steps of all 8 (each request's first token comes from its prompt step)
        assert not mixed and len(prefill_steps) == math.ceil(USERS * ISL / BUDGET)
        assert [s.num_decode_tokens for s in steps if not s.num_prefill_tokens] == [USERS] * (OSL - 1)
        assert "prefill steps apart from decode steps" in setup.cost_model.description
    else:
        # mixed: the requests prefilled in the first steps decode beside the later prompts' chunks
        assert mixed and all(s.num_prefill_tokens + s.num_decode_tokens <= BUDGET for s in steps)
        assert "prefill steps apart" not in setup.cost_model.description
