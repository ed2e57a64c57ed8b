"""``python -m engine``: a request that cannot fit, and bad settings, end in one ``error:`` line
on stderr with exit status 2 and nothing on stdout; a normal run prints the answer.

The model is the tiny random Llama saved as a local folder with a word-level tokenizer over its
512 ids (``w3`` is id 3, ...), so a prompt of N words is exactly N tokens."""

from __future__ import annotations

import re

import pytest
import torch

from engine.__main__ import main
from tests.engine.tiny import tiny_hf_model


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-with-tokenizer")
    words = ["<unk>", "<s>", "</s>", *(f"w{i}" for i in range(3, 512))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>").save_pretrained(
        folder
    )
    tiny_hf_model(0).save_pretrained(folder)
    return str(folder)


def run(capsys, folder: str, prompt: str, *flags: str) -> tuple[int, str, list[str]]:
    rc = main([prompt, "--model", folder, "--no-chat-template", "--dtype", "float32", *flags])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err.splitlines()


def words(n: int) -> str:
    return " ".join(f"w{3 + i % 500}" for i in range(n))


def test_a_normal_run_prints_the_answer(capsys, tiny_folder):
    rc, out, err = run(capsys, tiny_folder, words(3), "--max-tokens", "4")
    assert rc == 0 and err == [] and len(out.split()) == 4  # 4 word tokens (no EOS in 4 steps)


def test_max_tokens_past_max_model_len_exits_2_with_the_room_left(capsys, tiny_folder):
    # max_model_len = the model's 256 positions (the default 256 MiB pool holds far more).
    rc, out, err = run(capsys, tiny_folder, words(3), "--max-tokens", "100000000")
    assert (rc, out) == (2, "")
    assert err == [
        "error: --max-tokens: prompt 3 + max_tokens 100000000 = 100000003 tokens > "
        "max_model_len 256; use --max-tokens <= 253"
    ]


def test_a_prompt_past_max_model_len_exits_2_naming_the_prompt(capsys, tiny_folder):
    rc, out, err = run(capsys, tiny_folder, words(300))
    assert (rc, out) == (2, "")
    assert err == [
        "error: prompt: prompt 300 + max_tokens 128 = 428 tokens > max_model_len 256; shorten it below 256 tokens"
    ]


@pytest.mark.parametrize(
    "flags, line",
    [
        (("--device", "cuda"), r"error: device: cuda is not available here \(.+\); use device auto or cpu"),
        (("--seed", "-1"), r"error: seed: must be in \[0, 2\*\*64\) \(got -1\)"),
        (("--temperature", "nan"), r"error: temperature: must be a finite number >= 0 \(got nan\)"),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(capsys, monkeypatch, tiny_folder, flags, line):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, out, err = run(capsys, tiny_folder, words(3), *flags)
    assert (rc, out) == (2, "") and len(err) == 1
    assert re.fullmatch(line, err[0]), err
