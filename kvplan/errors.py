"""KvplanError: bad input becomes one line naming where, what, and the fix."""

from __future__ import annotations


class KvplanError(Exception):
    """A user-facing error: the CLI prints ``str(err)`` as one red line and exits with ``exit_code``.

    ``where`` names the input (a file, a YAML path such as ``buckets[1].concurrency``, a flag);
    ``problem`` says what is wrong with the value seen; ``fix`` (optional) says what to do.
    """

    exit_code = 2

    def __init__(self, where: str, problem: str, fix: str | None = None):
        self.where, self.problem, self.fix = where, problem, fix
        message = f"{where}: {problem}" if where else problem
        if fix:
            message += f"; {fix}"
        super().__init__(message)
