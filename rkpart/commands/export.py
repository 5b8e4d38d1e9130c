"""``rkpart export``: a diffusers pipeline folder -> transformer.onnx, vae_decoder.onnx and pipeline.json."""

from __future__ import annotations

import json
from pathlib import Path

import click

from rkpart.cli_args import OutputFolder, force_option, json_option, quiet_option, user_errors

_SIZE = click.IntRange(8, 16384)


@click.command("export")
@click.argument("pipeline_dir", type=click.Path(path_type=Path))
@click.option("--out", "-o", type=OutputFolder(), required=True,
              help="Folder to write: transformer.onnx, vae_decoder.onnx, pipeline.json (and inputs.npz).")
@click.option("--height", type=_SIZE, default=None,
              help="Image height in pixels, as the pipeline call takes it [default: the pipeline's].")
@click.option("--width", type=_SIZE, default=None,
              help="Image width in pixels, as the pipeline call takes it [default: the pipeline's].")
@click.option("--num-frames", type=click.IntRange(1, 4096), default=None,
              help="Frames of a video pipeline's call (its num_frames) [default: the pipeline's].")
@click.option("--text-len", type=click.IntRange(1, 65536), default=None,
              help="Tokens of the text sequence the pipeline hands the transformer (prompt_embeds.shape[1]) "
                   "[default: the call's max_sequence_length, else 77].")
@click.option("--batch", type=click.IntRange(1, 2), default=None,
              help="What one transformer call takes: 2 where the pipeline batches the CFG pair, 1 for one pass "
                   "at a time [default: as the pipeline calls it; 1 halves a batched pair into two passes].")
@click.option("--dtype", type=click.Choice(["float32", "float16"]), default="float32", show_default=True,
              help="Precision of transformer.onnx (the VAE decoder is exported in float32).")
@click.option("--exporter", type=click.Choice(["torchscript", "dynamo"]), default="torchscript", show_default=True,
              help="PyTorch's ONNX exporter (torchscript: opset 17; dynamo: its default opset).")
@force_option(help="Replace an existing export folder.")
@quiet_option
@json_option(help="Print the written description's summary as JSON.")
@user_errors
def export(pipeline_dir: Path, out: Path, height: int | None, width: int | None, num_frames: int | None,
           text_len: int | None, batch: int | None, dtype: str, exporter: str, force: bool, quiet: bool,
           as_json: bool) -> None:
    """Export a diffusers pipeline folder (save_pretrained) for rkpart.

    Runs the pipeline's own call on the export size with its transformer, scheduler and VAE
    hooked, derives pipeline.json from what it saw (which call argument feeds which transformer
    input, the timestep scaling, CFG, the latent layout), replays the call from that description
    to check it, and exports the transformer and the post-loop VAE path, each checked under ONNX
    Runtime. Needs the export extra: pip install 'rkpart[export]'.
    """
    from rkpart.output import claim_output_folder

    # the output rule (issue 51) before torch and diffusers are imported: never the pipeline folder, inside it or
    # holding it, never inside a plan, bundle or the cache (export_pipeline then refuses a folder rkpart did not write)
    claim_output_folder(out, what="export folder", inputs=[pipeline_dir])
    from rkpart.export.build import ExportOptions, export_pipeline
    from rkpart.progress import Reporter

    opts = ExportOptions(height=height, width=width, text_len=text_len, batch=batch, dtype=dtype, exporter=exporter,
                         force=force, num_frames=num_frames)
    with Reporter(quiet=quiet) as say:
        res = export_pipeline(pipeline_dir, out, opts, progress=say)
    d = res.description
    summary = {"out": str(out), "pipeline": d["pipeline"]["class"], "transformer": d["transformer"]["class"],
               "image": d["image"], "cfg": d["cfg"]["mode"], "inputs": {k: v["role"] for k, v in d["inputs"].items()},
               "errors": res.errors}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    img = d["image"]
    click.echo(f"export: {out}  {d['pipeline']['class']} ({d['transformer']['class']}), "
               f"{img['width']}x{img['height']}"
               f"{'' if img.get('num_frames') is None else ' x ' + str(img['num_frames']) + ' frames'}, "
               f"text {img['text_len']}, batch {img['batch']}, {d['cfg']['mode']} CFG")
    click.echo("inputs: " + ", ".join(f"{k}={v}" for k, v in summary["inputs"].items()))
    click.echo("ONNX Runtime vs torch (max |error| / max |torch|): "
               + ", ".join(f"{k} {v:.2g}" for k, v in res.errors.items()))
