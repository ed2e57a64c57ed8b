"""The ``kvplan`` console script (kvplan.cli.app.script) ends its process as Python would, less the
finalization: the same output and status as ``main()`` under ``python``, its atexit handlers run,
its non-daemon threads joined, a SystemExit message on stderr, and what a command leaves to it kept
till the end. Each case runs in a child process, since the script ends the process it runs in."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _child(code: str, *args: str) -> subprocess.CompletedProcess:
    """``python -c code args`` with stdout a pipe, block-buffered (what an unflushed end would lose)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False, env=env
    )


AS_PYTHON = "import sys; from kvplan.cli import main; sys.argv[0] = 'kvplan'; main()"
AS_SCRIPT = "import sys; from kvplan.cli import script; sys.argv[0] = 'kvplan'; script()"
WITH_APP = "import sys, kvplan.cli; app = sys.modules['kvplan.cli.app']"  # the module: kvplan.cli.app is the typer app


def test_the_script_prints_and_exits_as_main_does():
    estimate = ("estimate", "--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--json")
    bad = ("estimate", "--model", "llama-3.1-8b", "--gpu", "no-such-gpu")
    for args in (estimate, bad, ("--help",)):
        plain, scripted = _child(AS_PYTHON, *args), _child(AS_SCRIPT, *args)
        assert (scripted.returncode, scripted.stdout, scripted.stderr) == (
            plain.returncode,
            plain.stdout,
            plain.stderr,
        )
    assert _child(AS_SCRIPT, *estimate).returncode == 0 and _child(AS_SCRIPT, *bad).returncode == 2
    assert '"gpu"' in _child(AS_SCRIPT, *estimate).stdout  # all of a long stdout, flushed into a pipe


def test_atexit_handlers_and_threads_finish_before_the_process_ends(tmp_path):
    marker = tmp_path / "thread.txt"
    code = f"""
import atexit, sys, threading, time
from pathlib import Path
atexit.register(lambda: print("atexit ran", flush=True))
def late():
    time.sleep(0.5)
    Path({str(marker)!r}).write_text("written")
threading.Thread(target=late).start()
import kvplan.cli
app = sys.modules["kvplan.cli.app"]  # kvplan.cli.app is the typer app's name there
app.main = lambda: sys.exit(3)
app.script()
"""
    done = _child(code)
    assert done.returncode == 3 and done.stdout == "atexit ran\n" and marker.read_text() == "written"


def test_a_process_pool_left_open_ends_with_the_process():
    """A pool still referenced at the end: its manager thread (not a daemon) stops on threading's
    exit hook, as at Python's own end, and the script does not wait for it forever."""
    code = f"""{WITH_APP}
from concurrent.futures import ProcessPoolExecutor
POOLS = []
def main():
    POOLS.append(ProcessPoolExecutor(1))
    print(POOLS[0].submit(abs, -4).result())
    sys.exit(0)
app.main = main
app.script()
"""
    done = _child(code)
    assert (done.returncode, done.stdout) == (0, "4\n"), done.stderr


def test_a_systemexit_message_goes_to_stderr_with_status_1():
    done = _child(f"{WITH_APP}; app.main = lambda: sys.exit('boom'); app.script()")
    assert (done.returncode, done.stdout, done.stderr) == (1, "", "boom\n")
    none = _child(f"{WITH_APP}; app.main = lambda: sys.exit(None); app.script()")
    assert none.returncode == 0


def test_only_the_script_takes_what_a_command_leaves():
    code = """
import sys, kvplan.cli
app = sys.modules["kvplan.cli.app"]
assert app.left_to_exit() is None
def main():
    left = app.left_to_exit()
    assert left == []
    left.append(object())
    print("left", len(app.left_to_exit()))
    sys.exit(0)
app.main = main
app.script()
"""
    done = _child(code)
    assert (done.returncode, done.stdout) == (0, "left 1\n"), done.stderr


def test_a_simulation_under_the_script_writes_its_whole_report(tmp_path):
    out = tmp_path / "run"
    done = _child(AS_SCRIPT, "simulate", "workloads/smoke.yaml", "--quiet", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"report: {out}\n"
    for name in ("results.json", "summary.md", "steps.jsonl", "steps.csv", "requests.jsonl", "requests.csv"):
        assert (out / name).stat().st_size > 0, name
    steps = (out / "steps.jsonl").read_text().splitlines()
    assert len(steps) == len((out / "steps.csv").read_text().splitlines()) - 1  # every line, flushed
