"""aiconfigurator-core's database listing kept on disk (kvplan.sizing.gpus.silicon_db): a later
process reads the listing aiconfigurator itself gave, without reading its YAML files again, and a
system or backend it lacks still reads as empty, as in aiconfigurator's own listing."""

import pytest

from kvplan.sizing.gpus import silicon_db

aic = pytest.importorskip("aiconfigurator_core")


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process that has not read the listing yet, caching under ``tmp_path``; aiconfigurator's
    function restored after."""
    from aiconfigurator_core.sdk import perf_database

    monkeypatch.setenv("KVPLAN_CACHE", str(tmp_path))
    monkeypatch.setattr(perf_database, "get_supported_databases", perf_database.get_supported_databases)
    original = perf_database.get_supported_databases
    silicon_db._supported_databases.cache_clear()
    yield perf_database, original
    silicon_db._supported_databases.cache_clear()


def test_a_later_process_reads_the_kept_listing_equal_to_aiconfigurators(fresh, tmp_path):
    perf_database, original = fresh
    with silicon_db.quiet():
        theirs = original()
    first = silicon_db._supported_databases()
    kept = list((tmp_path / "aiconfigurator").glob("databases-*.json"))
    assert len(kept) == 1 and first == theirs

    silicon_db._supported_databases.cache_clear()  # a new process: aiconfigurator's own function again

    def refuse(systems_paths=None):
        raise AssertionError("read the YAML files again")

    perf_database.get_supported_databases = refuse
    second = silicon_db._supported_databases()
    assert second == theirs
    assert second["no-such-system"]["vllm"] == []  # a missing key reads as empty, as in theirs
    assert perf_database.get_supported_databases() is second  # what get_latest_database_version reads


def test_an_unreadable_kept_listing_is_read_afresh(fresh, tmp_path):
    perf_database, original = fresh
    path = silicon_db._listing_file(perf_database.get_systems_paths())
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with silicon_db.quiet():
        theirs = original()
    assert silicon_db._supported_databases() == theirs


def test_a_later_process_reads_the_kept_current_version_equal_to_aiconfigurators(fresh, tmp_path, monkeypatch):
    perf_database, _ = fresh
    silicon_db.default_version.cache_clear()
    with silicon_db.quiet():
        theirs = perf_database.get_latest_database_version("h100_sxm", "vllm")
    assert theirs is not None and silicon_db.default_version("h100_sxm", "vllm") == theirs
    kept = list((tmp_path / "aiconfigurator").glob("current-*.json"))
    assert len(kept) == 1

    silicon_db.default_version.cache_clear()  # a new process: nothing read yet but the kept file

    def refuse(*args, **kwargs):
        raise AssertionError("read the version slots again")

    monkeypatch.setattr(perf_database, "get_latest_database_version", refuse)
    assert silicon_db.default_version("h100_sxm", "vllm") == theirs
    silicon_db.default_version.cache_clear()
