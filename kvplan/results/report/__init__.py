"""The views of a run: tables (pandas -> Markdown, rich), charts (one ``plot_*(ax, data)`` each),
summary.md and its sections; ``render.render_report`` writes them all from the saved result."""
