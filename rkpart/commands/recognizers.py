"""``rkpart recognizers``: the block recognisers discovery consults (registered by rkpart.cli)."""

from __future__ import annotations

import json

import click

from rkpart.cli_args import json_option


@click.command()
@json_option()
def recognizers(as_json: bool) -> None:
    """List block recognisers: installed plugins and built-ins, and where each came from.

    Plugins with stage "before" are consulted before the built-in residual-chain discovery,
    those with stage "after" (and the built-in scope fallback) only when it finds no blocks.
    Plugins that failed to load are listed as BROKEN with the error (and skipped).
    """
    from rkpart.discovery.recognizers import BUILTIN, plugins, stage_of
    from rkpart.plugins import describe, render

    ps = plugins()
    rows = describe(((r.name, r.summary, f"rkpart ({type(r).__module__})") for r in BUILTIN), ps)
    for row in rows:
        obj = ps.loaded.get(row["name"]) if row["status"] == "plugin" else next(
            (r for r in BUILTIN if r.name == row["name"] and row["status"] == "built-in"), None)
        row["stage"] = stage_of(obj) if obj is not None else ""
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        if row["stage"]:
            row["summary"] = f"({row['stage']}) {row['summary']}"
    click.echo(render(rows))
