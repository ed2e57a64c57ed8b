"""engine.serve.threads: the main thread gives torch's threads to the engine-loop thread while a
server runs (one OpenMP team in the process), and gets them back after."""

import pytest
import torch

from engine.serve import app as serve_app
from engine.serve import threads
from engine.serve.loop import EngineLoop


@pytest.fixture
def three_threads():
    """torch on 3 threads on this thread (not the machine's default, so a count taken from it shows)."""
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield
    torch.set_num_threads(before)


class _Probe(EngineLoop):
    """A loop thread that records torch's thread count and ends."""

    seen: int | None = None

    def _run(self) -> None:
        self.seen = torch.get_num_threads()


def loop_thread_threads() -> int | None:
    probe = _Probe(engine=None)
    probe.start()
    probe._thread.join(10)
    return probe.seen


def test_the_loop_thread_takes_the_threads_main_gave_up(three_threads):
    with threads.torch_threads_for_engine_loop() as count:
        assert count == 3
        assert torch.get_num_threads() == 1  # the main thread opens no OpenMP team
        assert loop_thread_threads() == 3
    assert torch.get_num_threads() == 3


def test_without_the_reservation_a_loop_thread_keeps_torchs_setting(three_threads):
    assert threads._reserved is None
    assert loop_thread_threads() == 3  # a new thread starts from torch's process-wide count


def test_main_serves_inside_the_reservation_and_gives_it_back(three_threads, monkeypatch):
    seen = []

    def fake(args):
        seen.append((args.role, torch.get_num_threads(), threads._reserved))
        return 0

    monkeypatch.setattr(serve_app, "aggregated_main", fake)
    monkeypatch.setattr(serve_app, "role_main", fake)
    assert serve_app.main(["--model", "tiny-random-llama", "--port", "0"]) == 0
    assert serve_app.main(["--model", "tiny-random-llama", "--port", "0", "--role", "decode"]) == 0
    assert seen == [("aggregated", 1, 3), ("decode", 1, 3)]
    assert torch.get_num_threads() == 3 and threads._reserved is None


def test_bad_settings_give_the_threads_back(three_threads, capsys):
    assert serve_app.main(["--model", "tiny-random-llama", "--block-size", "0", "--port", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert torch.get_num_threads() == 3 and threads._reserved is None
