"""KvplanError: a field, never a flag, until the CLI renders it; a YAML path when it sits in a file."""

from kvplan.errors import KvplanError
from tests.kvplan.cli_runner import run_cli


def flag(name):
    return {"tp": "--tp", "weights_gib": "--weights-gib", "kv_memory_gib": "--kv-memory-gib"}.get(name)


def test_an_option_is_named_by_its_field_and_the_cli_spells_the_flag():
    err = KvplanError("weights_gib", "`kv_memory_gib` gives the KV pool directly", "drop `kv_memory_gib`")
    assert str(err) == "weights_gib: kv_memory_gib gives the KV pool directly; drop kv_memory_gib"
    assert err.render(flag) == "--weights-gib: --kv-memory-gib gives the KV pool directly; drop --kv-memory-gib"
    both = KvplanError("weights_gib, kv_memory_gib", "no effect")
    assert both.render(flag) == "--weights-gib, --kv-memory-gib: no effect"


def test_within_a_file_the_field_becomes_a_yaml_path_and_stays_one():
    err = KvplanError("tp", "3 does not divide the 32 attention heads", "pick `tp` among the divisors")
    inside = err.within(source="chat.yaml", prefix="plan[1]")
    assert str(inside) == "chat.yaml: plan[1].tp: 3 does not divide the 32 attention heads; pick tp among the divisors"
    assert inside.render(flag).startswith("chat.yaml: plan[1].tp: ")  # a path is never respelled as a flag
    assert (
        inside.within(fix="use another").render() == "chat.yaml: plan[1].tp: 3 does not divide the 32 attention"
        " heads; use another"
    )
    assert KvplanError("[2]", "bad").within(prefix="concurrency").field == "concurrency[2]"
    assert (inside.field, inside.source, inside.exit_code) == ("plan[1].tp", "chat.yaml", 2)


def test_the_cli_names_flags_for_the_same_error():
    code, out, err = run_cli("estimate", "--model", "llama-3.1-8b", "--tp", "3")
    assert (code, out) == (2, "")
    assert err == "error: --tp: 3 does not divide the 32 attention heads; pick a divisor of the head count\n"
