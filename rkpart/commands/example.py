"""``rkpart example``: copy the bundled tiny example model."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import click

from rkpart.cli_args import bundled_example, force_option


@click.command("example")
@click.argument("dest", type=click.Path(path_type=str), default="anima_tiny.onnx")
@force_option(help="Overwrite DEST.")
def example(dest: str, force: bool) -> None:
    """Copy the bundled tiny Anima-style example model to DEST.

    DEST is a file name, or a folder (an existing one, or any path ending in /) that gets
    anima_tiny.onnx; prints the path written.  The example is a 2-block DiT with the
    Anima / Cosmos-Predict2 block anatomy, for trying every command without a real model.
    """
    from rkpart.output import output_file

    path = Path(dest)
    if dest.endswith(("/", os.sep)) or (path.is_dir() and not path.is_symlink()):
        path = path / "anima_tiny.onnx"
    # a regular file or nothing: never a device node, FIFO, socket, folder or symlink (rkpart.output)
    with output_file(path, force=force, what="example destination") as tmp:
        shutil.copyfile(bundled_example(), tmp)
    click.echo(str(path))
