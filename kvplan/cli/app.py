"""The typer app every command registers on, its entry point and the helpers commands share.

Bad input raises :class:`kvplan.errors.KvplanError`; :func:`main` prints it as one red line on
stderr and exits 2. Library errors name an option by its field (``kv_cache_dtype``); only here does
it become the flag the user typed (``--kv-cache-dtype``).
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
from typing import Any, NoReturn

import typer

from kvplan.errors import KvplanError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="KV-cache capacity planning for LLM serving.",
)


# The cyclic collector's thresholds for a simulating command's process (CPython's default: 700,
# 10, 10). A simulation allocates millions of small objects that live till its end (the kept step
# and request records, a probe's requests) and makes few cycles; at the default, the collector ran
# 480 young and 4 full collections of them in the long-output case of bench/sim_long_outputs.py,
# 0.83 s of its 9 CPU-seconds, and 0.2 s with these (one young collection per 50,000 allocations).
# Not for a load test: a collection of that many young objects pauses its client's event loop.
GC_THRESHOLDS = (50_000, 20, 20)


def simulation_gc() -> None:
    """Collect cycles at ``GC_THRESHOLDS`` for the rest of this process (``kvplan simulate``,
    ``plan`` and ``advise``, whose work is simulation)."""
    gc.set_threshold(*GC_THRESHOLDS)


def main() -> None:
    """Console-script entry point. Bad input becomes one red line on stderr and exit 2, no
    traceback: a KvplanError, or a usage error typer raises (unknown option, a value of the wrong
    type). A command's ``typer.Exit(code)`` becomes the exit code; Ctrl-C outside a load test, 130."""
    try:
        code = app(standalone_mode=False, prog_name="kvplan")
    except KvplanError as err:
        error_line(err.render(_flag))
        sys.exit(err.exit_code)
    except typer.TyperException as err:  # typer's public base of its usage errors
        # plain `kvplan`: the help is the answer (NoArgsIsHelpError is a ClickException, which has show)
        if type(err).__name__ == "NoArgsIsHelpError" and hasattr(err, "show"):
            err.show()
        else:
            error_line(f"{err.format_message().rstrip('.')}; see `{_command_path(err)} --help`")
        sys.exit(getattr(err, "exit_code", 2))
    except typer.Abort:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


_LEFT: list[Any] | None = None  # what a command leaves to the OS (``script``); None: nothing


def left_to_exit() -> list[Any] | None:
    """Where a command may put what it holds at its end (a simulation's kept records) for the
    process's end to drop without freeing it object by object: a list under ``script``, else None
    (a library call or a test: let it be freed)."""
    return _LEFT


def script() -> NoReturn:
    """The ``kvplan`` console script: ``main()``, then the end Python gives a process (non-daemon
    threads joined, atexit handlers run, stdout and stderr flushed, ``SystemExit``'s code as its
    status) without its finalization, which frees every object one by one. After a
    20,000-request trace's report is written, freeing its kept records (some ten million objects)
    and the interpreter took 1.2-1.7 s (docs/benchmarks.md#trace-20k). An exception other than
    SystemExit propagates as before (its traceback, status 1). Where this Python has no
    ``threading._shutdown`` or ``atexit._run_exitfuncs`` (CPython's, which its finalization
    calls), the process ends as usual."""
    global _LEFT
    # what Python's finalization calls first: threading's own exit hooks (a process pool's manager
    # thread waits for them) and the join of non-daemon threads, then the atexit handlers
    shutdown, run_exitfuncs = getattr(threading, "_shutdown", None), getattr(atexit, "_run_exitfuncs", None)
    if shutdown is None or run_exitfuncs is None:
        main()
        sys.exit(0)
    _LEFT, code = [], None
    try:
        main()
    except SystemExit as done:
        code = done.code
    shutdown()
    run_exitfuncs()
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # as Python ends on a SystemExit("message"): the message on stderr, status 1
        print(code, file=sys.stderr)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said on it
            status = status or 120  # Python's status when flushing stdout fails at exit
    os._exit(status)


@app.callback()
def _root() -> None:
    """KV-cache capacity planning for LLM serving: estimate, measure, report, gate."""


def _command_path(err: typer.TyperException) -> str:
    """``kvplan estimate`` for a usage error in that command. Some parse errors (an option
    missing its value) carry no context: then the first word of argv that names a command."""
    ctx = getattr(err, "ctx", None)
    if ctx is not None:
        return ctx.command_path
    names = {c.name or getattr(c.callback, "__name__", "") for c in app.registered_commands}  # callback: always set
    word = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
    return f"kvplan {word}" if word in names else "kvplan"


def _flag(field: str) -> str | None:
    """``kv_cache_dtype`` -> ``--kv-cache-dtype`` when some command has that option (else None)."""
    import typer.main

    group = typer.main.get_command(app)
    for command in getattr(group, "commands", {}).values():
        for param in command.params:
            if param.name == field and param.opts and param.opts[0].startswith("--"):
                return param.opts[0]
    return None


def error_line(message: str) -> None:
    from rich.console import Console

    Console(stderr=True).print(f"error: {message}", style="red", markup=False, highlight=False, soft_wrap=True)


def exit_interrupted(run_dir) -> NoReturn:
    """A run stopped by Ctrl-C: one yellow line saying its report keeps what finished, then exit
    130, as SIGINT does (docs/loadtest.md, "Progress, interruption, exit codes").

    Raises:
        typer.Exit: always, code 130.
    """
    from rich.console import Console

    Console(stderr=True).print(
        f"interrupted: the report keeps the requests that finished ({run_dir})",
        style="yellow",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    raise typer.Exit(130)


def typed_options(ctx: typer.Context, names) -> list[str]:
    """The options of ``names`` the user gave, in order, whatever the value: an option left at its
    default is not given, one typed with its default value is. The context's parameter source tells
    them apart (compared by name: typer 0.29 carries its own copy of click's ParameterSource)."""
    return [
        name
        for name in names
        if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")
    ]


def given_only_with(ctx: typer.Context, names, switch: str, on: bool) -> None:
    """Refuse an option of ``names`` the user typed (:func:`typed_options`) while the option
    ``switch`` it belongs to is off (``on`` False): it would be ignored without a word.

    Raises:
        KvplanError: on the first such option, naming it and ``switch``.
    """
    if not on and (given := typed_options(ctx, names)):
        raise KvplanError(
            given[0], f"applies with `{switch}` only, which is not given", f"add `{switch}` or leave it out"
        )


def make_console():
    """A rich Console for tables. Piped into a file or a CI log there is no terminal width to fit
    (rich would assume 80 columns and cut the tables): keep each row on one line instead."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 140))


def warn(lines, source: str) -> None:
    """Each line as a yellow ``warning: SOURCE: line`` on stderr."""
    from rich.console import Console

    for line in lines:
        Console(stderr=True).print(
            f"warning: {source}: {line}", style="yellow", markup=False, highlight=False, soft_wrap=True
        )
