"""``rkpart strategies``: the built-in and plugin partition strategies."""

from __future__ import annotations

import click

from rkpart.cli_args import emit, json_option


@click.command("strategies")
@json_option()
def strategies(as_json: bool) -> None:
    """List partition strategies: built-in and installed plugins, and where each came from.

    Plugins that failed to load are listed as BROKEN with the error (and skipped); a second
    plugin with a taken name is listed as DUPLICATE or SHADOWED.
    """
    from rkpart.grouping.strategies import plugins
    from rkpart.pipeline import BUILTIN
    from rkpart.plugins import describe, render

    rows = describe(((s.name, s.summary, f"rkpart ({s.__module__})") for s in BUILTIN), plugins())
    emit(as_json, lambda: rows, lambda: render(rows))
