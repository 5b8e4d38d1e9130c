"""The partition pipeline: model file -> loaded graph -> partition -> plan folder.

Each step is a function of the previous step's value, so a caller that needs the graph for
something else (``rkpart inspect``, the drop-in's strategy choice) loads it once and hands it
on::

    model = load("model.onnx")                         # graph + discovery (on first use)
    part = propose(model, "auto", PartitionConfig(options={"budget_mib": 512}))
    plan = write_plan(model, part, "build/")           # crash-safe, resumable

:func:`partition` is those three calls.  ``auto`` (:mod:`rkpart.auto`) is not in
:mod:`rkpart.strategies`: it asks the strategies for whole-model partitions, hands them to
the cost model as candidates (:mod:`rkpart.cost_model.candidates`) and assembles the
cost model's choice (:func:`rkpart.cost_model.select.choose`), so it sits above both, and
below this module, which lists it among the built-in strategies.

Package layers (``tests/test_import_dag.py`` enforces them; a package imports only from
layers to its left, never back, not even inside a function)::

    errors, types <- io, output, units, progress
      <- ir <- targets <- partitioner <- plugins <- recognizers <- strategies
      <- validation <- compile <- runtime <- triage <- profile <- cost_model <- bundle, report
      <- auto <- pipeline <- tune <- dropin <- cli_args <- commands <- cli
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rkpart import strategies
from rkpart.auto import AutoStrategy
from rkpart.ir import ModelGraph, load_model
from rkpart.partitioner.coverage import Coverage, coverage_note, npu_coverage
from rkpart.partitioner.discovery import Discovery
from rkpart.partitioner.extract import DEFAULT_EXTERNAL_THRESHOLD
from rkpart.partitioner.partition import Partition
from rkpart.partitioner.plan import Plan
from rkpart.partitioner.weights import WeightsMode
from rkpart.partitioner.write import prepare_out, write_partition
from rkpart.progress import Progress
from rkpart.recognizers import discover
from rkpart.strategies.base import Strategy, check_strategy_options, propose_with
from rkpart.strategies.fused import FusedStrategy
from rkpart.strategies.split import SplitStrategy
from rkpart.targets import DEFAULT_TARGET, TARGETS, get_target
from rkpart.targets.opset import lowering_note
from rkpart.targets.rewrites import rewrites_for


def _noop(_: str) -> None:
    pass


# -- the loaded model ---------------------------------------------------------------------


@dataclass
class LoadedModel:
    """A validated graph and, once asked for, its block discovery (computed once)."""

    graph: ModelGraph
    input_shapes: Mapping[str, tuple[int, ...]] | None = None
    _discovery: Discovery | None = field(default=None, repr=False)

    @property
    def path(self) -> Path:
        return self.graph.path

    def discovery(self, progress: Progress = _noop) -> Discovery:
        """Blocks and regions (recognisers included); raises :class:`~rkpart.errors.DiscoveryError`."""
        if self._discovery is None:
            progress("discovering blocks")
            self._discovery = discover(self.graph)
            disc = self._discovery
            progress(f"found {len(disc.blocks)} blocks by {disc.method}: "
                     f"{', '.join(r.name for r in disc.blocks[0].regions)} per block")
        return self._discovery


def load(
    model: str | os.PathLike[str],
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    progress: Progress = _noop,
) -> LoadedModel:
    """Load and validate ``model`` (any size; inline or external weights)."""
    progress(f"loading {model}")
    return LoadedModel(load_model(model, input_shapes=input_shapes), input_shapes)


def inspect_model(
    model: str | os.PathLike[str], input_shapes: Mapping[str, tuple[int, ...]] | None = None
) -> tuple[ModelGraph, Discovery]:
    """Load and discover without writing anything (``rkpart inspect``)."""
    loaded = load(model, input_shapes)
    return loaded.graph, loaded.discovery()


# -- strategies -----------------------------------------------------------------------------


def available() -> dict[str, type[Strategy]]:
    """Every strategy by name: the built-ins (``auto`` last), then plugins that loaded."""
    return strategies.available(BUILTIN)


def get_strategy(name: str) -> Strategy:
    """A new instance of the strategy ``name``; :class:`~rkpart.errors.UserError` if unknown or broken."""
    return strategies.get_strategy(name, BUILTIN)


@dataclass(frozen=True)
class PartitionConfig:
    """How to propose and write a partition (everything but the model and the strategy).

    ``target`` / ``toolkit``: whose capabilities the proposal is checked against; with a
    ``toolkit`` the partition's notes name NPU stages holding ops that toolkit cannot
    convert, and a model opset it cannot load.
    """

    options: Mapping[str, Any] = field(default_factory=dict)
    force: bool = False
    external_threshold: int = DEFAULT_EXTERNAL_THRESHOLD
    simplify: bool = False
    weights: WeightsMode = "copy"
    target: str = DEFAULT_TARGET
    toolkit: str | None = None
    progress: Progress = field(default=_noop, compare=False)

    def __post_init__(self) -> None:
        # options are values a plan records; a callback goes to the strategy (AutoStrategy(report=...))
        called = sorted(k for k, v in self.options.items() if callable(v))
        if called:
            raise TypeError(f"strategy option {called[0]!r} is a callable; pass callbacks to the strategy "
                            "instance (e.g. AutoStrategy(report=...)), not as options")


def propose(model: LoadedModel, strategy: str | Strategy, config: PartitionConfig = PartitionConfig()) -> Partition:
    """The partition ``strategy`` proposes for ``model``, checked against the target's capabilities."""
    strat = get_strategy(strategy) if isinstance(strategy, str) else strategy
    opts = check_options(strat, config.options)
    disc = model.discovery(config.progress) if strat.needs_blocks else None
    part = propose_with(strat, model.graph, disc, built=opts)
    notes = capability_notes(model.graph, part, config.target, config.toolkit)
    if disc is not None:
        low = coverage_note(model.graph, npu_coverage(model.graph, disc, part.groups))
        if low is not None:
            notes.append(f"{part.strategy}: {low}")
    for note in notes:
        config.progress(f"warning: {note}")
    if not any(g.device == "npu" for g in part.groups):
        # recorded in the plan's notes; the CLI warns on stderr even with --quiet
        notes.append(f"strategy {part.strategy} put no stage on the NPU: the whole model runs on the host")
    if notes:
        part = Partition(part.strategy, part.options, part.groups, (*part.notes, *notes))
    return part


def inspect_report(mg: ModelGraph, disc: Discovery) -> dict[str, Any]:
    """``rkpart inspect --json`` from the graph's facts: :func:`rkpart.ir.describe`, the discovery,
    and per block and region the tensor names to cut at (a custom spec's ``cut``): the residual
    stream into and out of every region, and what enters its core after the AdaLN."""
    from rkpart.ir import describe

    blocks = disc.summary()
    for b, summary in zip(disc.blocks, blocks, strict=True):
        regions: list[dict[str, Any]] = summary["regions"]  # type: ignore[assignment]
        for r, rs in zip(b.regions, regions, strict=True):
            rs["input"] = [br.skip for br in r.branches]
            rs["core_inputs"] = sorted({t for br in r.branches for t in br.core_in})
            rs["output"] = [mg.nodes[br.add].output[0] for br in r.branches]
        summary["input"] = regions[0]["input"] if regions else []
        summary["output"] = regions[-1]["output"] if regions else []
    coverage = {name: c.to_json() for name, c in strategy_coverage(mg, disc).items()}
    return {**describe(mg), "streams": disc.streams, "method": disc.method,
            "prologue_ops": len(disc.prologue), "epilogue_ops": len(disc.epilogue),
            "glue_ops": len(disc.glue), "blocks": blocks, "npu_coverage": coverage}


def strategy_coverage(mg: ModelGraph, disc: Discovery) -> dict[str, Coverage]:
    """NPU coverage of the ``split`` and ``fused`` proposals (``rkpart inspect``)."""
    return {name: npu_coverage(mg, disc, propose_with(cls(), mg, disc).groups)
            for name, cls in (("split", SplitStrategy), ("fused", FusedStrategy))}


def capability_notes(mg: ModelGraph, part: Partition, target: str, toolkit: str | None) -> list[str]:
    """What ``toolkit`` will not do with ``part``: load its opset, run each NPU stage's ops on the NPU.

    Nothing is checked without a ``toolkit``, or for a target rkpart has no capability table
    for (the toolkit itself still decides when it builds).
    """
    if toolkit is None or target.lower() not in TARGETS:
        return []
    caps = get_target(target).caps(toolkit)
    notes = []
    # compile lowers the opset and rewrites some ops onto the NPU (rkpart.targets.opset / rewrites)
    lowering = lowering_note(mg.opset, {caps.version: caps.max_opset})
    if lowering:
        notes.append(f"target {target}: {lowering} when compiled")
    rewritten = {r.op_type for r in rewrites_for(caps.version, "npu") if r.every_node}
    for g in part.groups:
        if g.device != "npu":
            continue
        off = caps.off_npu(mg.nodes[i] for i in sorted(g.ops) if mg.nodes[i].op_type not in rewritten)
        if off:
            ops = ", ".join(sorted({f"{n.op_type} ({rule.support})" for n, rule in off}))
            notes.append(f"target {target}: NPU stage {g.id} holds op(s) rknn-toolkit2 {caps.version} does not "
                         f"run on the NPU: {ops}")
    return notes


def write_plan(
    model: LoadedModel, part: Partition, out: str | os.PathLike[str], config: PartitionConfig = PartitionConfig()
) -> Plan:
    """Write ``part`` as the plan folder ``out`` (see :func:`rkpart.partitioner.write.write_partition`)."""
    simplify = None
    if config.simplify:
        from rkpart.runtime.simplify import simplify_stage  # onnxsim and ONNX Runtime: only when asked

        simplify = simplify_stage
    return write_partition(model.graph, model._discovery, part, out, force=config.force,
                           input_shapes=model.input_shapes, external_threshold=config.external_threshold,
                           simplify=simplify, progress=config.progress, weights=config.weights)


@dataclass(frozen=True)
class PartitionOptions:
    """Everything ``rkpart partition`` was asked to do: model, plan folder, strategy and how.

    ``input_shapes`` are static shapes for inputs with symbolic dimensions (used when the
    model is loaded); ``config`` is how the partition is proposed and written.
    """

    model: Path
    out: Path
    strategy: str | Strategy = "split"  # a name, or a Strategy instance
    config: PartitionConfig = PartitionConfig()
    input_shapes: Mapping[str, tuple[int, ...]] | None = None


def run_partition(opts: PartitionOptions) -> Plan:
    """Partition ``opts.model`` and write the plan folder ``opts.out``: load, propose, write.

    The output folder is checked first, so a model of any size is not read for an output
    that cannot be written.
    """
    strat = get_strategy(opts.strategy) if isinstance(opts.strategy, str) else opts.strategy
    # before loading: a model of any size is not read for options that cannot be used
    check_options(strat, opts.config.options)
    prepare_out(Path(os.path.abspath(opts.out)), opts.config.force, Path(opts.model))
    loaded = load(opts.model, opts.input_shapes, opts.config.progress)
    return write_plan(loaded, propose(loaded, strat, opts.config), opts.out, opts.config)


def partition(
    model: str | os.PathLike[str],
    out: str | os.PathLike[str],
    strategy: str | Strategy = "split",
    *,
    force: bool = False,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    external_threshold: int = DEFAULT_EXTERNAL_THRESHOLD,
    simplify: bool = False,
    progress: Progress = _noop,
    weights: WeightsMode = "copy",
    **options: Any,
) -> Plan:
    """Partition ``model`` with ``strategy`` and write the plan folder ``out``.

    The keyword form of :func:`run_partition` (which ``rkpart partition`` calls with one
    :class:`PartitionOptions`).

    Parameters
    ----------
    model:
        ONNX file (inline weights or external data; any size).
    out:
        Plan folder to create.  An existing non-empty one is replaced only with ``force``,
        and only once the new plan is complete.
    strategy:
        ``split``, ``fused``, ``custom``, ``generic``, ``auto``, any registered strategy, or a
        :class:`~rkpart.strategies.base.Strategy` instance (one not registered as a plugin).
    simplify:
        Run onnxsim on every NPU stage, keeping the result only when its outputs equal the
        original's under ONNX Runtime.
    weights:
        ``copy`` (each stage gets its own data file) or ``link`` (no weights copied: stages
        reference the source's external data, linked into the plan folder).
    **options:
        Strategy options (``adaln="npu"``, ``blocks_per_stage=2``, ``spec="spec.yaml"`` ...).

    Returns
    -------
    Plan
        The plan that was written to ``out/plan.json``.

    Examples
    --------
    >>> plan = partition("anima.onnx", "build/", strategy="split")  # doctest: +SKIP
    >>> len(plan.npu_stages)  # doctest: +SKIP
    84
    """
    config = PartitionConfig(options=options, force=force, external_threshold=external_threshold,
                             simplify=simplify, progress=progress, weights=weights)
    return run_partition(PartitionOptions(Path(model), Path(out), strategy, config, input_shapes))


def check_options(strategy: str | Strategy, options: Mapping[str, Any]) -> Any:
    """Refuse options that do not fit ``strategy`` (the CLI's flags), before anything is loaded:
    :func:`~rkpart.strategies.base.check_strategy_options` with every registered strategy's
    options known, so that an option of another strategy is named as such; then the strategy's
    own checks.  Returns the options built (:meth:`~rkpart.strategies.base.Strategy.options_from`).

    Raises
    ------
    UserError
        an option ``strategy`` does not read, a missing one it requires, or a bad value.
    """
    strat = get_strategy(strategy) if isinstance(strategy, str) else strategy
    check_strategy_options(strat, options, known={n: c.accepts or () for n, c in available().items()})
    return strat.options_from(options)


#: every built-in strategy, in the order ``rkpart strategies`` lists them (``auto``: :mod:`rkpart.auto`)
BUILTIN: tuple[type[Strategy], ...] = (*strategies.BUILTIN, AutoStrategy)


__all__ = ["BUILTIN", "LoadedModel", "PartitionConfig", "PartitionOptions", "available", "capability_notes",
           "check_options", "get_strategy", "inspect_model", "inspect_report", "load", "partition", "propose",
           "run_partition", "strategy_coverage", "write_plan"]
