"""One real vLLM server for the whole session, shared by every module of tests marked ``vllm``
(starting it takes 35-60 s on 2 cores): SmolLM2 with vllm_server's pool (16 blocks of 32 tokens,
``max_model_len`` 256). Each test's levels use cache salts of their own, and counters are
differenced across a level, so the tests do not see each other's requests."""

import pytest

from tests.kvplan.run.server import vllm_server


@pytest.fixture(scope="session")
def vllm_live(tmp_path_factory):
    """(OpenAI base URL, path of vLLM's log) of the session's vLLM; started on first use."""
    from engine.models.loader import smollm2_folder

    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with vllm_server.serve(
        smollm2_folder(),
        log,
        num_blocks=vllm_server.NUM_BLOCKS,
        block_size=vllm_server.BLOCK_SIZE,
        max_model_len=vllm_server.MAX_MODEL_LEN,
    ) as url:
        yield url, log
