"""The link table and the KV transfer price, checked by hand arithmetic."""

import random
from pathlib import Path

import pytest
import yaml

from kvplan.errors import KvplanError
from kvplan.sizing.gpus.links import LINKS_FILE, Link, SharedLink, link_table, lookup_link, prompt_transfer_bytes
from kvplan.sizing.models.model_spec import ModelSpec

TINY = {  # 2 layers x 2 KV heads x head dim 16, bf16: 2 x 2 x (2 x 16) x 2 = 256 bytes a token
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "torch_dtype": "bfloat16",
}


def test_every_link_has_a_source_a_bandwidth_and_a_setup():
    for name, entry in link_table().items():
        assert entry["gbps"] > 0 and entry["setup_us"] >= 0 and len(entry["source"]) > 40, name


def test_lookup_by_name_and_alias_in_any_case():
    pcie5 = lookup_link("PCIe5")
    assert pcie5.name == "pcie5"
    assert pcie5.bytes_per_s == pytest.approx(32e9 * 16 * 128 / 130 / 8, rel=1e-3)  # 32 GT/s x16, 128b/130b
    assert lookup_link("nvlink").name == "nvlink4" and lookup_link("nvlink").bytes_per_s == 450e9
    assert lookup_link("rdma_400g").bytes_per_s == 50e9  # 400 Gb/s / 8
    assert lookup_link("dynamo-mocker").bytes_per_s == 64e9 and lookup_link("dynamo-mocker").setup_s == 0
    own = lookup_link({"gbps": 10, "setup_us": 20})
    assert (own.bytes_per_s, own.setup_s) == (10e9, 20e-6)


@pytest.mark.parametrize(
    ("link", "problem"),
    [
        ("pcie7", "unknown link 'pcie7'"),
        ({"gbps": 0}, "needs a `gbps` above 0"),
        ({"gbps": 1, "setup_us": -1}, "`setup_us`"),
        # once read as 0 us without a word (the misspelt key dropped)
        ({"gbps": 10, "setup": 3}, "unknown key 'setup'; a link takes `gbps` and `setup_us`"),
    ],
)
def test_bad_links_are_one_line_naming_the_field(link, problem):
    with pytest.raises(KvplanError) as err:
        lookup_link(link, "engine.disagg.link")
    assert err.value.field == "engine.disagg.link" and problem in err.value.problem
    assert "\n" not in str(err.value)


def test_unknown_link_names_the_closest():
    with pytest.raises(KvplanError) as err:
        lookup_link("pcie")
    # difflib ratios: pcie4 and pcie5 8/9, pcie4-x8 and pcie5-x8 8/12; ties in reverse name order
    assert err.value.problem == "unknown link 'pcie' (closest: pcie5, pcie4, pcie5-x8)"


def test_unknown_link_lists_every_link_on_one_line():
    # 'fast' is near no name: once the hint fell back to a loose list; now the closest (when any
    # is close) and then every canonical name of links.yaml, read here apart from the module
    names = list(yaml.safe_load(LINKS_FILE.read_text())["links"])
    with pytest.raises(KvplanError) as err:
        lookup_link("fast")
    assert err.value.problem == "unknown link 'fast'" and len(names) > 20
    assert err.value.fix == f"use one of {', '.join(names)}; or give {{gbps: N, setup_us: N}}"


def test_prompt_bytes_are_whole_blocks_per_rank():
    spec = ModelSpec.from_hf_config(TINY, "tiny")
    # 100 tokens in blocks of 16: 7 blocks = 112 token slots x 256 bytes
    assert prompt_transfer_bytes(spec, 100, 16) == 7 * 16 * 256
    # tp 2: each rank holds 1 of the 2 KV heads, half the bytes
    assert prompt_transfer_bytes(spec, 100, 16, tp=2) == 7 * 16 * 128
    # fp8 KV: 1 byte an element
    assert prompt_transfer_bytes(spec, 100, 16, kv_cache_dtype="fp8") == 7 * 16 * 128


def test_one_transfer_alone_is_setup_plus_bytes_over_bandwidth():
    link = Link("test", bytes_per_s=1e9, setup_s=1e-3)
    assert link.seconds(2e6) == pytest.approx(1e-3 + 2e-3)
    shared = SharedLink(link)
    shared.start("a", 10.0, 2e6)
    assert shared.next_end() == pytest.approx(10.003)
    assert shared.take_done(10.0029) == []
    assert shared.take_done(10.003) == ["a"] and len(shared) == 0


def test_two_transfers_started_together_take_twice_as_long():
    shared = SharedLink(Link("test", 1e9, 0.0))
    shared.start("a", 0.0, 1e6)
    shared.start("b", 0.0, 1e6)
    assert shared.next_end() == pytest.approx(2e-3)  # each at 0.5 GB/s
    assert shared.take_done(2e-3) == ["a", "b"]


def test_a_late_transfer_shares_the_rest():
    # a: 3 MB at t=0 on 1 GB/s; b: 1 MB at t=1 ms. a alone moves 1 MB by 1 ms; then both at
    # 0.5 GB/s: b's 1 MB ends at 3 ms (a has moved 1 MB more, 1 MB left); a alone again: 4 ms.
    shared = SharedLink(Link("test", 1e9, 0.0))
    shared.start("a", 0.0, 3e6)
    shared.start("b", 1e-3, 1e6)
    assert shared.next_end() == pytest.approx(3e-3)
    assert shared.take_done(3e-3) == ["b"]
    assert shared.next_end() == pytest.approx(4e-3)
    assert shared.take_done(4e-3) == ["a"]


def test_setup_time_holds_no_bandwidth():
    # 1 GB/s, 1 ms setup. a (1 MB) starts at 0 and flows from 1 ms; b (1 MB) starts at 0.5 ms and
    # flows from 1.5 ms. a alone moves 0.5 MB by 1.5 ms, then both at 0.5 GB/s: a's last 0.5 MB
    # ends at 2.5 ms (b has 0.5 MB left), b alone again: 3 ms.
    shared = SharedLink(Link("test", 1e9, 1e-3))
    shared.start("a", 0.0, 1e6)
    shared.start("b", 0.5e-3, 1e6)
    assert shared.next_end() == pytest.approx(2.5e-3)
    assert shared.take_done(2.5e-3) == ["a"]
    assert shared.next_end() == pytest.approx(3e-3)
    assert shared.take_done(3e-3) == ["b"]


@pytest.mark.parametrize("where", ["engine", "plan"])
@pytest.mark.parametrize(
    ("link", "line"),
    [
        ({"gbps": 10, "latency": 3}, "disagg.link: unknown key 'latency'; a link takes gbps and setup_us"),
        # once "link.str: must be a string [+1 more]", pydantic's union of a name and a mapping
        ({"gbps": "fast"}, "disagg.link: needs a gbps above 0 (got 'fast')"),
    ],
)
def test_a_bad_link_mapping_in_a_workload_names_the_link(tmp_path, where, link, line):
    import yaml

    from kvplan.workload.file import load_workload

    data = yaml.safe_load((Path(__file__).resolve().parents[3] / "workloads" / "smoke.yaml").read_text())
    disagg = {"prefill": {"workers": 1}, "decode": {"workers": 1}, "link": link}
    if where == "engine":
        data["engine"]["disagg"], prefix = disagg, "engine."
    else:
        data["plan"] = [{"model": "llama-3.1-8b", "gpu": "H100-SXM", "disagg": disagg}]
        prefix = "plan[0]."
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(KvplanError) as err:
        load_workload(path)
    assert str(err.value).startswith(f"{path}: {prefix}{line}"), err.value


@pytest.fixture
def no_hang():
    """Fail (TimeoutError) instead of hanging: the float-residue bug looped forever."""
    import signal

    def alarm(signum, frame):
        raise TimeoutError("the link never finished a transfer")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_a_transfer_ends_at_its_end_late_in_a_run(no_hang):
    # 10 GB/s, 1,000 s setup (the clock at 1,000 s, as a 17-minute level): 'a' (4,096 B) alone ends
    # at 1,000 + 4,096 / 10^10 s; 'b' (8,192 B, started 1 ms later) then has 4,096 B left at full rate,
    # ending at 1,000.001 + 8,192 / 10^10 s. Once 'b' kept 4.6e-4 bytes of float residue (over the
    # 9e-6 byte tolerance) that its end time could not move: take_done gave [] at that end, forever
    link = SharedLink(Link("x", 10e9, 1000.0))
    link.start("a", 0.0, 4096.0)
    link.start("b", 0.001, 8192.0)
    ends = []
    while (end := link.next_end()) is not None:
        ends.append((end, link.take_done(end)))
    assert [done for _, done in ends] == [["a"], ["b"]]
    assert ends[0][0] == pytest.approx(1000 + 4096 / 10e9, abs=1e-12)
    assert ends[1][0] == pytest.approx(1000.001 + 8192 / 10e9, abs=1e-9)


def test_every_transfer_ends_at_the_time_next_end_gives(no_hang):
    # 300 random links: up to 6 transfers of 1 B to 131 MB started within a millisecond at clocks of
    # 0 s to 10^6 s (11.6 days, past a level's 24 h); each next_end() must hand back a done transfer
    rng = random.Random(0)
    for _ in range(300):
        link = SharedLink(Link("x", rng.choice([1.1e9, 10e9, 50e9]), rng.choice([0, 2e-6, 1e-4])))
        now = link.now = rng.choice([0.0, 10.0, 1000.0, 86400.0, 1e6])
        keys = list(range(rng.randint(1, 6)))
        for key in keys:
            now += rng.random() * 1e-3
            link.start(key, now, float(rng.choice([1, 4096, 8192, 12345, 131072 * 1000])))
        done: list = []
        while (end := link.next_end()) is not None:
            got = link.take_done(end)
            assert got, (end, {k: t.remaining for k, t in link._moving.items()})
            done += got
        assert sorted(done) == keys
