"""``rkpart encode``: a prompt through the pipeline's own text encoders -> the ``--embeds`` file of the board runner."""

from __future__ import annotations

import json
from pathlib import Path

import click

from rkpart.cli_args import OutputFile, force_option, json_option, quiet_option, user_errors


@click.command("encode")
@click.argument("pipeline_dir", type=click.Path(path_type=Path))
@click.option("--pipeline", "description", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The pipeline.json rkpart export wrote for this pipeline (its call arguments, size and text "
                   "length).")
@click.option("--prompt", required=True, help="The prompt.")
@click.option("--negative-prompt", default=None,
              help="The negative prompt of CFG pipelines [default: the pipeline's, usually empty].")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True,
              help="Seed of the pipeline call's generator (the encoders are deterministic; the latents drawn are "
                   "not kept).")
@click.option("--out", "-o", type=OutputFile(), required=True,
              help=".npz to write, keyed by the call arguments (runner.py --embeds).")
@force_option(help="Replace an existing --out file rkpart encode wrote.")
@quiet_option
@json_option(help="Print the written arrays' shapes as JSON.")
@user_errors
def encode(pipeline_dir: Path, description: Path, prompt: str, negative_prompt: str | None, seed: int, out: Path,
           force: bool, quiet: bool, as_json: bool) -> None:
    """Encode a prompt with the pipeline's own text encoders (torch; the export extra).

    Runs PIPELINE_DIR's own call (its tokenizers and text encoders, saved by save_pretrained) up
    to its first step at the size and text length of the export, and writes what its transformer
    was given as the call arguments pipeline.json names (prompt_embeds, negative_prompt_embeds,
    pooled_prompt_embeds, prompt_attention_mask, ...): the file runner.py --embeds and rkpart
    drift --embeds take.

    \b
      rkpart encode PIPELINE_DIR --pipeline OUT/pipeline.json --prompt "a red cat" -o embeds.npz
    """
    from rkpart.export.encode import encode as run_encode
    from rkpart.export.encode import write_embeds
    from rkpart.output import claim_output_file, npz_is_rkparts
    from rkpart.progress import Reporter

    claim_output_file(out, what="--out", force=force, owned=npz_is_rkparts, inputs=[pipeline_dir, description])
    with Reporter(quiet=quiet) as say:
        arrays = run_encode(pipeline_dir, description, prompt, negative_prompt, seed=seed, progress=say)
    write_embeds(out, arrays, force=force)
    shapes = {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in sorted(arrays.items())}
    if as_json:
        click.echo(json.dumps({"out": str(out), "arrays": shapes}, indent=2))
        return
    click.echo(f"embeds: {out}  " + ", ".join(f"{k} {v['dtype']} {v['shape']}" for k, v in shapes.items()))
