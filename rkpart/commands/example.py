"""``rkpart example``: copy the bundled tiny example model."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import click

from rkpart.cli_args import OutputFile, bundled_example, force_option


@click.command("example")
@click.argument("dest", type=OutputFile(dir_okay=True, path_type=str), default="anima_tiny.onnx")
@force_option(help="Replace DEST if it is the example rkpart wrote there (its bytes).")
def example(dest: str, force: bool) -> None:
    """Copy the bundled tiny Anima-style example model to DEST.

    DEST is a file name, or a folder (an existing one, or any path ending in /) that gets
    anima_tiny.onnx; prints the path written.  The example is a 2-block DiT with the
    Anima / Cosmos-Predict2 block anatomy, for trying every command without a real model.
    """
    from rkpart.output import claim_output_file, head_bytes, output_file

    path = Path(dest)
    if dest.endswith(("/", os.sep)) or (path.is_dir() and not path.is_symlink()):
        path = path / "anima_tiny.onnx"
    src = bundled_example()
    mine = src.read_bytes()

    def owned(p: Path) -> bool:  # every example rkpart writes is these bytes
        return p.stat().st_size == len(mine) and head_bytes(p, len(mine) + 1) == mine

    # a regular file or nothing: never a device node, FIFO, socket, folder or symlink, never inside a
    # folder rkpart manages, replaced (--force) only if it is the example (rkpart.output)
    claim_output_file(path, what="example destination", force=force, owned=owned)
    with output_file(path, force=True, what="example destination") as tmp:
        shutil.copyfile(src, tmp)
    click.echo(str(path))
