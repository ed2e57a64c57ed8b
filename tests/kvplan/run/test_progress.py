"""Progress in a CI log: plain lines per level, not a bar."""

import io

from rich.console import Console

from kvplan.results.records import LevelKey
from kvplan.run.driver import Finished, Level
from kvplan.run.progress import level_progress


def finished(reason: str, tokens: int) -> Finished:
    return Finished("r", 0.0, None, 1.0, (), 3, tokens, reason)


def test_without_a_terminal_each_level_prints_plain_lines():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    level = Level(LevelKey("short", "closed", 8), 0, (None,) * 4)
    with level_progress(console, level, every_s=0.0) as advance:
        advance(finished("length", 10), 3)
        advance(finished("error", 0), 2)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and "\x1b" not in out.getvalue()  # one per request (every 0 s) and one at the end
    assert lines[0].startswith("short c=8: 1/4 done, 3 in flight, 0 failed, ")
    assert lines[-1].startswith("short c=8: 2/4 done, 2 in flight, 1 failed, ") and lines[-1].endswith(" s")


def test_requests_refused_at_the_entry_count_as_rejected_not_failed():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    level = Level(LevelKey("short", "open", 12.0), 0, (None,) * 3)
    with level_progress(console, level, every_s=60.0) as advance:
        advance(finished("rejected", 0), 2)
        advance(finished("rejected", 0), 1)
        advance(finished("stop", 7), 0)
    (line,) = out.getvalue().splitlines()  # only the level's last line (every 60 s)
    assert line.startswith("short 12 req/s: 3/3 done, 0 in flight, 0 failed, 2 rejected, ")
