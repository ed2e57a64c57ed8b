"""The `kvplan` command line: one typer app (kvplan.cli.app), one module per command.

Each command parses its options, calls one library function and renders the result. Heavy imports
(torch, transformers, pandas, matplotlib) stay inside the command bodies that need them, so
`kvplan --help` and `kvplan estimate` start fast. To add a command: a module here with one
function, registered below (the order is ``kvplan --help``'s).
"""

from kvplan.cli import advise, compare, estimate, gate, loadtest, plan, profile, report, schema, simulate
from kvplan.cli.app import app, main, script

app.command()(estimate.estimate)
app.command()(loadtest.loadtest)
app.command()(simulate.simulate)
app.command()(advise.advise)
app.command()(plan.plan)
app.command()(report.report)
app.command()(profile.profile)
app.command(name="compare")(compare.compare_runs)
app.command()(gate.gate)
app.command()(schema.schema)

__all__ = ["app", "main", "script"]
