"""``rkpart inspect``: the blocks and regions found in a model (nothing is written)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from rkpart.cli_args import bundled_example, json_option, lowering_note, model_argument, shape_option
from rkpart.types import JsonObject
from rkpart.units import mib

if TYPE_CHECKING:
    from rkpart.discovery.structure import Discovery
    from rkpart.ir import ModelGraph


@click.command("inspect")
@model_argument()
@shape_option
@click.option("--inputs", "inputs_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Representative model inputs (.npz): shapes that depend on the data (NonZero on a mask, an If) "
                   "are resolved by one ONNX Runtime run on them and the graph is specialised to them.")
@json_option()
def inspect(model: Path | None, shapes: dict[str, tuple[int, ...]], inputs_file: Path | None,
            as_json: bool) -> None:
    """Show the blocks and regions found in MODEL (nothing is written)."""
    from rkpart.grouping.coverage import strategy_coverage
    from rkpart.ir import describe
    from rkpart.pipeline import inspect_model

    if model is None:
        model = bundled_example()
    mg, disc = inspect_model(model, shapes or None, inputs=inputs_file)
    if as_json:
        report = inspect_report(mg, disc)
        click.echo(json.dumps({**report, "lowering": lowering_note(int(report["opset"] or 0))}, indent=2))
        return
    info = describe(mg)
    coverage = strategy_coverage(mg, disc)
    click.echo(f"{info['file']}: opset {info['opset']}, {info['nodes']} nodes ({info['const_nodes']} constant), "
               f"weights {mib(info['weight_bytes'])} MiB")
    for kind in ("inputs", "outputs"):
        for t in info[kind]:
            click.echo(f"  {kind[:-1]:<6} {t['name']} {t['dtype']} {t['shape']}")
    click.echo(f"{len(disc.blocks)} blocks, {disc.streams} residual stream(s), numbered by {disc.method}; "
               f"prologue {len(disc.prologue)} ops, glue {len(disc.glue)}, epilogue {len(disc.epilogue)}")
    for b in disc.blocks:
        regs = ", ".join(
            f"{r.name}[{r.kind}; adaln={r.adaln}{'; gated' if r.gate else ''}; "
            f"{len(r.pre)}+{len(r.core)}+{len(r.gate) + len(r.adds)} ops]"
            for r in b.regions
        )
        scope = f" ({b.scope})" if b.scope else ""
        n_mod = len(b.mod) + sum(len(r.mod) for r in b.regions)
        click.echo(f"  block {b.index:>2}{scope}: {regs}; modulation {n_mod} ops")
    from rkpart.report.coverage import UNITS

    click.echo(f"on the NPU, {UNITS['matmul']}: " + ", ".join(
        f"{name} {c.share * 100:.1f} %" for name, c in coverage.items()))
    for n in disc.notes:
        click.echo(f"note: {n}")
    note = lowering_note(int(info["opset"] or 0))
    if note:
        click.echo(f"note: {note} (when compiled)")


def inspect_report(mg: ModelGraph, disc: Discovery) -> JsonObject:
    """``rkpart inspect --json`` from the graph's facts: :func:`rkpart.ir.describe`, the discovery,
    and per block and region the tensor names to cut at (a custom spec's ``cut``): the residual
    stream into and out of every region, and what enters its core after the AdaLN."""
    from rkpart.grouping.coverage import strategy_coverage
    from rkpart.ir import describe

    blocks = disc.summary()
    for b, summary in zip(disc.blocks, blocks, strict=True):
        regions: list[JsonObject] = summary["regions"]  # type: ignore[assignment]
        for r, rs in zip(b.regions, regions, strict=True):
            rs["input"] = [br.skip for br in r.branches]
            rs["core_inputs"] = sorted({t for br in r.branches for t in br.core_in})
            rs["output"] = [mg.op(br.add).outputs[0] for br in r.branches]
        summary["input"] = regions[0]["input"] if regions else []
        summary["output"] = regions[-1]["output"] if regions else []
    coverage = {name: c.to_json() for name, c in strategy_coverage(mg, disc).items()}
    return {**describe(mg), "streams": disc.streams, "method": disc.method,
            "prologue_ops": len(disc.prologue), "epilogue_ops": len(disc.epilogue),
            "glue_ops": len(disc.glue), "blocks": blocks, "npu_coverage": coverage}
