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

    errors, types <- io, output, units, progress <- export
      <- ir <- targets <- partitioner <- plugins <- recognizers <- strategies
      <- validation <- compile <- runtime <- triage <- profile <- cost_model <- bundle, report
      <- auto <- pipeline <- tune <- dropin <- cli_args <- commands <- cli
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rkpart import strategies
from rkpart.auto import AutoStrategy
from rkpart.errors import UserError
from rkpart.io import file_sha256
from rkpart.ir import ModelGraph, load_model
from rkpart.ir.load import (
    NARROW_INPUT_RANK,
    NPU_ALIGN,
    RANK4_PREFIX,
    rank4_view,
    with_merged_tensors,
    with_rank4_inputs,
    with_rank4_views,
)
from rkpart.ir.subgraph import outputs_of
from rkpart.ir.values import same_values
from rkpart.partitioner.capability import apply_capability as _apply_capability
from rkpart.partitioner.capability import cut_before, left_after_rewrites
from rkpart.partitioner.coverage import Coverage, coverage_note, npu_coverage
from rkpart.partitioner.discovery import Discovery
from rkpart.partitioner.extract import DEFAULT_EXTERNAL_THRESHOLD
from rkpart.partitioner.partition import Partition, acyclic
from rkpart.partitioner.plan import Plan
from rkpart.partitioner.weights import WeightsMode
from rkpart.partitioner.write import prepare_out, write_partition
from rkpart.progress import Progress
from rkpart.recognizers import discover
from rkpart.strategies.base import Strategy, check_strategy_options, propose_with, settle_rank4_views
from rkpart.strategies.fused import FusedStrategy
from rkpart.strategies.split import SplitStrategy
from rkpart.targets import DEFAULT_TARGET, TARGETS, get_target
from rkpart.targets.capability import Capability
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
            progress(f"found {len(disc.blocks)} blocks by {disc.method}: {disc.describe_regions()}")
        return self._discovery


def load(
    model: str | os.PathLike[str],
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    progress: Progress = _noop,
    inputs: str | os.PathLike[str] | None = None,
) -> LoadedModel:
    """Load and validate ``model`` (any size; inline or external weights).

    ``inputs``: an ``.npz`` of representative model inputs; shapes that depend on the data
    (``NonZero`` on a mask, an ``If``) are resolved by one ONNX Runtime run on them and the
    graph is specialised to them (:func:`rkpart.runtime.specialise.load_specialised`).
    """
    progress(f"loading {model}")
    if inputs is None:
        return LoadedModel(load_model(model, input_shapes=input_shapes), input_shapes)
    from rkpart.io import check_finite_arrays
    from rkpart.readers import read_npz
    from rkpart.runtime.specialise import load_specialised

    feeds = read_npz(inputs, what="--inputs file")
    check_finite_arrays(feeds, what=f"--inputs file {inputs}")
    mg = load_specialised(model, feeds, input_shapes=input_shapes)
    if mg.specialised:  # where the inputs came from: ``compile --repartition`` partitions again with them
        where = str(Path(inputs).resolve())
        mg = dataclasses.replace(mg, specialised=tuple({**r, "inputs_file": where} for r in mg.specialised))
    for rec in mg.specialised:
        progress(f"specialised to --inputs: {rec['op']} {rec['node']!r} gives {rec['tensor']!r} shape {rec['shape']}")
    return LoadedModel(mg, input_shapes)


def inspect_model(
    model: str | os.PathLike[str], input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    inputs: str | os.PathLike[str] | None = None,
) -> tuple[ModelGraph, Discovery]:
    """Load and discover without writing anything (``rkpart inspect``)."""
    loaded = load(model, input_shapes, inputs=inputs)
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

    ``target`` / ``toolkit``: whose capability decides the grouping (default: the target's
    default toolkit).  Ops that toolkit does not run on the NPU -- not loadable, measured on
    the CPU, or placed there by an earlier build (``learned``: the placements of
    :mod:`rkpart.compile.learned`) -- leave NPU stages unless one of its rewrites removes them
    (``rewrites=False``: the build will apply none).  ``force_host`` names ops (by node name)
    that leave NPU stages whatever the rewrites do, with why: ``rkpart compile --repartition``
    passes the layers the last build of the plan put on the CPU.  ``capability=False`` turns
    all of it off (the strategy's grouping is written as proposed).
    """

    options: Mapping[str, Any] = field(default_factory=dict)
    force: bool = False
    external_threshold: int = DEFAULT_EXTERNAL_THRESHOLD
    simplify: bool = False
    weights: WeightsMode = "copy"
    target: str = DEFAULT_TARGET
    toolkit: str | None = None
    progress: Progress = field(default=_noop, compare=False)
    capability: bool = True
    learned: bool = True
    rewrites: bool = True
    force_host: Mapping[str, str] = field(default_factory=dict)
    #: op names an NPU stage is cut in front of, with why (a build crashed after fusing them)
    cut_before: Mapping[str, str] = field(default_factory=dict)
    #: the pipeline description to record (``--pipeline``); None: ``pipeline.json`` beside the model, if any
    pipeline: Path | None = None

    def __post_init__(self) -> None:
        # options are values a plan records; a callback goes to the strategy (AutoStrategy(report=...))
        called = sorted(k for k, v in self.options.items() if callable(v))
        if called:
            raise TypeError(f"strategy option {called[0]!r} is a callable; pass callbacks to the strategy "
                            "instance (e.g. AutoStrategy(report=...)), not as options")


def capability_for(config: PartitionConfig) -> Capability | None:
    """The capability ``config`` partitions with (``None``: off, or a target without a table)."""
    if not config.capability:
        return None
    from rkpart.compile.learned import target_capability

    cap: Capability | None = target_capability(config.target, config.toolkit, learned=config.learned,
                                               rewrites=config.rewrites)
    return cap


#: proposals at most that merge value-equal outputs of an NPU stage (each pass merges what the last left)
_MERGE_PASSES = 3


def propose(model: LoadedModel, strategy: str | Strategy, config: PartitionConfig = PartitionConfig()) -> Partition:
    """The partition ``strategy`` proposes for ``model``, checked against the target's capabilities.

    An NPU stage never hands the host two tensors that hold the same values by construction (a
    tensor and its alias, or two equal computations): the toolkit may build one output for both
    (:mod:`rkpart.ir.values`), so the model's readers of the second read the first and the model
    is proposed again."""
    strat = get_strategy(strategy) if isinstance(strategy, str) else strategy
    opts = check_options(strat, config.options)
    merged: dict[str, str] = {}
    for _ in range(_MERGE_PASSES):
        part, lines = _propose_once(model, strat, opts, config)
        same = same_values(model.graph, _npu_outputs(model.graph, part))
        if not same:
            break
        merged.update(same)
        config.progress(f"merging {len(same)} output(s) of NPU stages that hold the same values as another "
                        "output of the stage (the toolkit may build one output for both): proposing again")
        model.graph, model._discovery = with_merged_tensors(model.graph, same), None
    for line in lines:
        config.progress(line)
    if merged:
        note = (f"{len(merged)} tensor(s) read as another that holds the same values (an NPU stage would have "
                "handed both to the host; the toolkit may build one output for both): "
                + ", ".join(f"{a} -> {b}" for a, b in sorted(merged.items())[:8])
                + (" ..." if len(merged) > 8 else ""))
        part = dataclasses.replace(part, notes=(*part.notes, note))
    return part


def _npu_outputs(mg: ModelGraph, part: Partition) -> list[list[str]]:
    """Per NPU group of ``part``, the outputs its stage will have (:func:`rkpart.ir.subgraph.outputs_of`)."""
    return [list(outputs_of(mg, g.ops)) for g in part.groups if g.device == "npu"]


def _propose_once(model: LoadedModel, strat: Strategy, opts: Mapping[str, Any],
                  config: PartitionConfig) -> tuple[Partition, list[str]]:
    """One proposal of :func:`propose` and the progress lines it has for the user (said once, for the
    proposal kept)."""
    lines: list[str] = []
    disc = model.discovery(config.progress) if strat.needs_blocks else None
    # any strategy, plugins too: stages that feed each other are re-cut or merged (and noted),
    # before the capability pass, which relies on convex groups
    part = acyclic(model.graph, propose_with(strat, model.graph, disc, built=opts))
    if _reads_wide_inputs(model.graph, part):
        # an NPU stage would take a model input of rank > 4 (a CPU Reshape on 2.3.0): read such
        # inputs through a rank-4 view (the strategies hand the view to the stage) and propose again
        model.graph, model._discovery = with_rank4_inputs(model.graph), None
        disc = model.discovery(config.progress) if strat.needs_blocks else None
        part = acyclic(model.graph, propose_with(strat, model.graph, disc, built=opts))
    narrow = _narrow_npu_inputs(model.graph, part)
    if narrow:
        # an NPU stage would take a rank-3 tensor with an unaligned last dim from the host (the
        # toolkit converts it on the CPU): hand it a rank-4 view, reshaped back inside the stage
        model.graph, model._discovery = with_rank4_views(model.graph, narrow), None
        disc = model.discovery(config.progress) if strat.needs_blocks else None
        part = acyclic(model.graph, propose_with(strat, model.graph, disc, built=opts))
    for note in part.notes:
        if " cycle " in note:
            lines.append(note)
    cap = capability_for(config)
    said: list[str] = []
    if cap is not None:
        part = apply_capability(model.graph, part, cap, config.force_host, said.append)
    for _ in range(_VIEW_PASSES):
        narrow = _narrow_crossings(model.graph, part)
        if not narrow:
            break
        # the moves left a tensor the toolkit converts on the CPU (rank 3 with an unaligned last dim,
        # rank > 4) crossing into or out of an NPU stage: it crosses as a rank-4 view, and the model
        # is proposed again (the moves on the new graph can leave another such crossing: again)
        model.graph, model._discovery = with_rank4_views(model.graph, narrow), None
        disc = model.discovery(config.progress) if strat.needs_blocks else None
        part = acyclic(model.graph, propose_with(strat, model.graph, disc, built=opts))
        said = []
        if cap is not None:
            part = apply_capability(model.graph, part, cap, config.force_host, said.append)
        part = settle_rank4_views(model.graph, part)
    lines += said
    if config.cut_before:
        part, cuts = cut_before(model.graph, part, config.cut_before)
        if cuts:
            rec = dict(part.extra.get("capability") or {})
            part = dataclasses.replace(part, extra={**part.extra, "capability": {**rec, "cuts": cuts}})
    notes = capability_notes(model.graph, part, config.target, config.toolkit)
    if disc is not None:
        low = coverage_note(model.graph, npu_coverage(model.graph, disc, part.groups))
        if low is not None:
            notes.append(f"{part.strategy}: {low}")
    lines += [f"warning: {note}" for note in notes]
    if not any(g.device == "npu" for g in part.groups):
        # recorded in the plan's notes; the CLI warns on stderr even with --quiet
        notes.append(f"strategy {part.strategy} put no stage on the NPU: the whole model runs on the host")
    if notes:
        part = dataclasses.replace(part, notes=(*part.notes, *notes))
    return part, lines


def _narrow_npu_inputs(mg: ModelGraph, part: Partition) -> list[str]:
    """Tensors of rank :data:`~rkpart.ir.load.NARROW_INPUT_RANK` whose last dim is not a multiple of
    :data:`~rkpart.ir.load.NPU_ALIGN` that an NPU group of ``part`` reads from the host or as a
    model input (:func:`rkpart.ir.load.with_rank4_views`)."""
    npu = {i for g in part.groups if g.device == "npu" for i in g.ops}
    out: list[str] = []
    for i in sorted(npu):
        for t in mg.op(i).inputs:
            shape = mg.shape(t) if t else None
            if not t or t in out or shape is None or len(shape) != NARROW_INPUT_RANK or shape[-1] % NPU_ALIGN == 0 \
                    or mg.is_const_tensor(t) or mg.producer.get(t) in npu or t.startswith(RANK4_PREFIX):
                continue
            out.append(t)
    return out


#: proposals with rank-4 views at most (each pass views every crossing the last one left)
_VIEW_PASSES = 3


def _narrow_crossings(mg: ModelGraph, part: Partition) -> list[str]:
    """Tensors the toolkit converts on the CPU at a stage boundary that cross into or out of an NPU
    group of ``part``: read from another group or as a model input, or read by another group (not
    model outputs: the plan gives those as the model does).

    Measured (``build_once``, rk3588): a tensor of rank :data:`~rkpart.ir.load.NARROW_INPUT_RANK`
    whose last dim is not a multiple of :data:`~rkpart.ir.load.NPU_ALIGN`, as a stage input or
    output, 2.3.0 and 2.5.0; a tensor of rank > 4, as a stage input (``Reshape:<t>_rs``) or output
    (the op producing it runs on the CPU), 2.3.0 (2.5.0 runs both on the NPU; the view costs it
    nothing)."""
    owner = {i: k for k, g in enumerate(part.groups) for i in g.ops}
    npu = {k for k, g in enumerate(part.groups) if g.device == "npu"}
    outputs = set(mg.outputs)
    out: list[str] = []
    for k in sorted(npu):
        for i in sorted(part.groups[k].ops):
            op = mg.op(i)
            for t in (*op.inputs, *op.outputs):
                shape = mg.shape(t) if t else None
                if not t or t in out or t in outputs or shape is None or mg.is_const_tensor(t) \
                        or t.startswith(RANK4_PREFIX):
                    continue
                narrow = len(shape) == NARROW_INPUT_RANK and shape[-1] % NPU_ALIGN != 0
                if not narrow and rank4_view(shape) is None:
                    continue
                p = mg.producer.get(t)
                comes_in = p is None or owner.get(p) != k  # a model input, or another group's
                goes_out = p is not None and owner.get(p) == k and any(owner.get(c) != k
                                                                        for c in mg.consumers.get(t, ()))
                if comes_in or goes_out:
                    out.append(t)
    return out


def _reads_wide_inputs(mg: ModelGraph, part: Partition) -> bool:
    """Whether an NPU group of ``part`` reads a float model input of rank > 4 directly."""
    wide = {t for t in mg.inputs if mg.is_float(t) and rank4_view(mg.shape(t) or ()) is not None}
    return bool(wide) and any(t in wide for g in part.groups if g.device == "npu" for i in g.ops
                              for t in mg.op(i).inputs)


def apply_capability(mg: ModelGraph, part: Partition, cap: Capability, force_host: Mapping[str, str] | None = None,
                     progress: Progress = _noop) -> Partition:
    """``part`` with every op ``cap`` does not run on the NPU moved to the host (see
    :mod:`rkpart.partitioner.capability`), the moves recorded in ``extra.capability``."""
    return _apply_capability(mg, part, cap, force_host, progress)


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
            rs["output"] = [mg.op(br.add).outputs[0] for br in r.branches]
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
        off = caps.off_npu(mg.op(i) for i in sorted(g.ops) if mg.op(i).op_type not in rewritten)
        if off:
            # only what stays on the CPU once the build's rewrites ran (nan-guard takes IsNaN's guard onto the NPU)
            left = left_after_rewrites(mg, g, (n.index for n, _ in off), Capability(target.lower(), caps))
            off = [(n, rule) for n, rule in off if n.index in left]
        if off:
            ops = ", ".join(sorted({f"{n.op_type} ({rule.support})" for n, rule in off}))
            notes.append(f"target {target}: NPU stage {g.id} holds op(s) rknn-toolkit2 {caps.version} does not "
                         f"run on the NPU: {ops}")
    return notes


def write_plan(
    model: LoadedModel, part: Partition, out: str | os.PathLike[str], config: PartitionConfig = PartitionConfig(),
    description: Any = None,
) -> Plan:
    """Write ``part`` as the plan folder ``out`` (see :func:`rkpart.partitioner.write.write_partition`),
    with ``description`` (a :class:`rkpart.description.PipelineDescription`) recorded in it."""
    from rkpart.roles import description_attacher, record_description

    simplify = None
    if config.simplify:
        from rkpart.runtime.simplify import simplify_stage  # onnxsim and ONNX Runtime: only when asked

        simplify = simplify_stage
    return write_partition(model.graph, model._discovery, record_description(part, description), out,
                           force=config.force, input_shapes=model.input_shapes,
                           external_threshold=config.external_threshold, simplify=simplify, progress=config.progress,
                           weights=config.weights, attach=description_attacher(description))


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
    #: representative inputs (``.npz``) resolving shapes that depend on data (``--inputs``)
    inputs: Path | None = None


def run_partition(opts: PartitionOptions) -> Plan:
    """Partition ``opts.model`` and write the plan folder ``opts.out``: load, propose, write.

    The output folder is checked first, so a model of any size is not read for an output
    that cannot be written.
    """
    strat = get_strategy(opts.strategy) if isinstance(opts.strategy, str) else opts.strategy
    # before loading: a model of any size is not read for options that cannot be used
    check_options(strat, opts.config.options)
    prepare_out(Path(os.path.abspath(opts.out)), opts.config.force, Path(opts.model))
    loaded = load(opts.model, opts.input_shapes, opts.config.progress, inputs=opts.inputs)
    from rkpart.roles import describe_partition  # pipeline.json: checked against the model before any proposal

    description = describe_partition(Path(opts.model), opts.config.pipeline, loaded.graph, opts.config.progress)
    return write_plan(loaded, propose(loaded, strat, opts.config), opts.out, opts.config, description)


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
    pipeline: str | os.PathLike[str] | None = None,
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
    pipeline:
        The pipeline description (``pipeline.json``) to record in the plan, checked against the
        model's inputs [default: ``pipeline.json`` beside the model, if there is one].
    **options:
        Strategy options (``adaln="npu"``, ``blocks_per_stage=2``, ``spec="spec.yaml"`` ...).
        ``toolkit="2.5.0"`` is taken by every strategy: the rknn-toolkit2 version whose capability
        decides the grouping (default: the target's default toolkit); for ``auto`` also the
        toolkit whose known crashes exclude candidates.  ``inputs="inputs.npz"`` is not a strategy
        option either: representative model inputs, whose ONNX Runtime run resolves shapes that
        depend on the data; the plan is specialised to them (``plan.specialised``; ``docs/plan.md``).

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
    toolkit = options.get("toolkit") if strategy == "auto" else options.pop("toolkit", None)
    inputs = options.pop("inputs", None)
    config = PartitionConfig(options=options, force=force, external_threshold=external_threshold,
                             simplify=simplify, progress=progress, weights=weights, toolkit=toolkit,
                             pipeline=None if pipeline is None else Path(pipeline))
    return run_partition(PartitionOptions(Path(model), Path(out), strategy, config, input_shapes,
                                          Path(inputs) if inputs is not None else None))


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


__all__ = ["BUILTIN", "LoadedModel", "PartitionConfig", "PartitionOptions", "RepartitionRound", "apply_capability",
           "available", "capability_for", "capability_notes", "check_options", "compile_repartition", "get_strategy",
           "inspect_model", "inspect_report", "load", "partition", "propose", "run_partition", "strategy_coverage",
           "write_plan"]


# -- compile --repartition: placement learned from the plan's own builds -----------------------------


@dataclass(frozen=True)
class RepartitionRound:
    """One round of ``rkpart compile --repartition``: what moved or was cut, and what was left."""

    round: int
    moved: tuple[str, ...]  # op names the last build put on the CPU, now on the host
    cpu_layers_before: int
    cpu_layers_after: int
    stages_built: int
    cut_before: tuple[str, ...] = ()  # op names a crashed build fused, now the first op of a new stage
    failed_before: int = 0
    failed_after: int = 0
    #: this round wrote the plan of an earlier, better round again (the rounds after it made it worse)
    kept_best: bool = False

    def describe(self) -> str:
        if self.kept_best:
            return (f"repartition round {self.round}: the rounds before made it worse; the best round's plan "
                    f"written again: CPU layers in NPU stages {self.cpu_layers_before} -> {self.cpu_layers_after}, "
                    f"failed stages {self.failed_before} -> {self.failed_after}; {self.stages_built} stage(s) rebuilt")
        cut = f"; {len(self.cut_before)} cut(s) in front of ops a crashed build fused" if self.cut_before else ""
        failed = (f", failed stages {self.failed_before} -> {self.failed_after}"
                  if self.cut_before or self.failed_before else "")
        return (f"repartition round {self.round}: {len(self.moved)} op(s) the build put on the CPU (or that fail it) "
                f"moved to the host; CPU layers in NPU stages {self.cpu_layers_before} -> {self.cpu_layers_after}"
                f"{cut}{failed}; {self.stages_built} stage(s) rebuilt")


#: rounds ``--repartition`` runs at most (each moves every op the last build put on the CPU)
MAX_REPARTITION_ROUNDS = 4
#: failures a cut in front of fused ops can work around (the graph's fault); OOM, disk and resource limits are the
#: machine's, and a timeout names no fusion (it is reduced instead: :func:`rkpart.triage.isolate.failing_ops`)
_CUTTABLE = ("crash", "error")


def crash_cuts(report: Any, folder: Path, stages: set[str] | None = None) -> dict[str, str]:
    """Op name -> why, for the ops the crashed builds of ``report`` fused just before they died.

    The crash's known issue names the optimiser rules that lead to it
    (:attr:`~rkpart.targets.known_issues.KnownIssue.fusion_rules`); an unknown crash suspects the
    last fusion rule its log shows.  An unknown *error* (an exception the toolkit raised, not a
    signal) is no evidence against a fusion: it is left to :func:`rkpart.triage.isolate.failing_ops` (Kandinsky 6's
    ``swap_reshape`` ValueError got 60 useless cuts).  The ids of the stages cut are added to
    ``stages``.
    """
    from rkpart.compile.runner import read_log
    from rkpart.targets.known_issues import fused_nodes, match_log

    out: dict[str, str] = {}
    for o in report.outcomes:
        if o.status != "failed" or not o.failures or o.failures[-1].kind not in _CUTTABLE:
            continue
        for f in o.failures:
            if f.kind not in _CUTTABLE or not f.log:
                continue
            try:
                text = read_log(folder / f.log, folder)
            except (OSError, UserError):
                continue
            issue = match_log(text, signal=f.signal, toolkit=f.toolkit, kind=f.kind, exit_code=f.exit_code)
            if issue is None and f.kind == "error":
                continue
            for rule, name in fused_nodes(text, issue.fusion_rules if issue and issue.fusion_rules else None):
                if stages is not None:
                    stages.add(o.stage_id)
                what = f"known issue {issue.id}" if issue else f"{f.kind}, no known issue"
                out.setdefault(name, f"the build of stage {o.stage_id} failed ({what}) after {rule} fused it: "
                                     "a new NPU stage starts here so the rule cannot fire")
    return dict(sorted(out.items()))


def compile_repartition(plan_path: str | os.PathLike[str], opts: Any, progress: Progress = _noop,
                        max_rounds: int = MAX_REPARTITION_ROUNDS) -> tuple[Any, list[RepartitionRound], list[str]]:
    """Compile the plan, then re-partition it from what the builds did, until nothing is left to fix.

    Each round (1) moves every op a build put on the CPU inside an NPU stage to the host (the
    build already applied the rewrites: such an op is not rescued by one), and (2) cuts every
    stage whose build crashed in front of the ops the optimiser fused before the crash (the
    workaround that matches the crash's signature, for any spelling of the pattern); then it
    writes the plan again into its folder with the same strategy and options and compiles it.
    Stages that did not change are the same builds, taken from the build cache.  Stops when no
    NPU stage has a CPU layer or failed, when nothing more can move or be cut, or after
    ``max_rounds``.

    Returns the last compile report, the rounds, and the CPU layers that could not move.

    Raises
    ------
    UserError
        The plan's model is gone or changed, or the plan's strategy cannot be re-run.
    """
    from rkpart.compile.compile import compile_folder, learn_placements
    from rkpart.compile.learned import forced_host, traced_layers
    from rkpart.partitioner.plan import load_plan
    from rkpart.triage import isolate

    _, folder = load_plan(plan_path)
    folder = Path(folder)
    quiet = dataclasses.replace(opts, learn=False)  # learned below, from the layers this loop traces once

    def build() -> tuple[Any, list[Any]]:
        rep = compile_folder(folder, quiet, progress)
        return rep, (learn_placements(rep, folder, opts.target, progress) if opts.learn
                     else traced_layers(rep, folder))

    report, layers = build()
    forced: dict[str, str] = {}
    cuts: dict[str, str] = {}
    rounds: list[RepartitionRound] = []

    def badness(rep: Any) -> tuple[int, int, int]:  # failed stages, then CPU layers, then stages
        return len(rep.failed), sum(len(o.cpu_ops) for o in rep.outcomes), len(rep.outcomes)

    best = (badness(report), dict(forced), dict(cuts))
    isolated = isolate.Isolated()  # stage files reduced, and the subgraphs found failing, over the rounds
    for r in range(1, max_rounds + 1):
        before = sum(len(o.cpu_ops) for o in report.outcomes)
        failed = len(report.failed)
        if not before and not failed:
            break
        new = {k: v for k, v in forced_host(layers).items() if k not in forced}
        cut_stages: set[str] = set()
        new_cuts = {k: v for k, v in crash_cuts(report, folder, cut_stages).items() if k not in cuts}
        if failed:  # a failed stage no new cut can help: the ops that fail the build alone go to the host
            skip = cut_stages if new_cuts else set()
            new.update({k: v for k, v in isolate.failing_ops(report, folder, opts, isolated, progress,
                                                             skip=skip).items() if k not in forced})
        if not new and not new_cuts:
            break
        forced.update(new)
        cuts.update(new_cuts)
        progress(f"repartition round {r}: moving {len(new)} op(s) the build put on the CPU (or that fail it) to the "
                 f"host, cutting in front of {len(new_cuts)} op(s) a failed build fused")
        _write_again(report.plan, folder, opts, forced, cuts, progress)
        report, layers = build()
        after = sum(len(o.cpu_ops) for o in report.outcomes)
        rounds.append(RepartitionRound(r, tuple(sorted(new)), before, after, len(report.built),
                                       tuple(sorted(new_cuts)), failed, len(report.failed)))
        if badness(report) < best[0]:
            best = (badness(report), dict(forced), dict(cuts))
    if badness(report) > best[0]:
        # a move can make it worse (a stage input the toolkit converts on the CPU moves one op on per
        # round): the plan of the best round is written again, its stages taken from the build cache
        progress(f"repartition: keeping the plan of the best round ({best[0][1]} CPU layer(s), {best[0][0]} "
                 f"failed stage(s)); the last round left {badness(report)[1]} and {badness(report)[0]}")
        _write_again(report.plan, folder, opts, best[1], best[2], progress)
        report, layers = build()
        rounds.append(RepartitionRound(len(rounds) + 1, (), rounds[-1].cpu_layers_after,
                                       sum(len(o.cpu_ops) for o in report.outcomes), len(report.built),
                                       (), rounds[-1].failed_after, len(report.failed), kept_best=True))
    # what is left when no round can move or cut anything more (or the rounds ran out)
    stuck = sorted(f"{o.stage_id}: {c}" for o in report.outcomes for c in o.cpu_ops)
    return report, rounds, stuck


def _write_again(plan: Plan, folder: Path, opts: Any, forced: Mapping[str, str], cuts: Mapping[str, str],
                 progress: Progress) -> None:
    """Partition the plan's model again into ``folder`` with its strategy, ``forced`` ops on the host."""
    model = Path(str(plan.model.get("path") or ""))
    if not model.is_file():
        raise UserError(f"--repartition needs the plan's model {plan.model.get('path') or plan.model.get('file')}, "
                        "which is gone; partition it again with rkpart partition")
    if file_sha256(model) != plan.model.get("sha256"):
        raise UserError(f"--repartition: the plan's model {model} changed since it was partitioned; partition it "
                        "again with rkpart partition")
    name = str(plan.strategy.get("name"))
    if name not in available():
        raise UserError(f"--repartition: the plan's strategy {name!r} is not available here")
    strat = get_strategy(name)
    options = dict(plan.strategy.get("options") or {})
    if strat.accepts is not None:  # what the strategy recorded of its choice is not an option
        options = {k: v for k, v in options.items() if k in strat.accepts}
    head = graph_io_of(model)
    shapes = {t: tuple(plan.tensors[t].shape) for t in head if t in plan.tensors and head[t]}
    inputs = _specialised_inputs(plan)
    loaded = load(model, shapes or None, progress, inputs=inputs)
    # CompileOptions takes a Toolkit too; the partition is asked by the version it runs
    config = PartitionConfig(options=options, force=True, target=opts.target,
                             toolkit=getattr(opts.toolkit, "version", opts.toolkit),
                             rewrites=opts.rewrites, force_host=forced, cut_before=cuts, progress=progress,
                             weights="link" if "weights" in plan.extra else "copy")
    from rkpart.roles import plan_description  # the plan's pipeline description stays with it

    write_plan(loaded, propose(loaded, strat, config), folder, config, plan_description(plan, folder))


def _specialised_inputs(plan: Plan) -> Path | None:
    """The ``--inputs`` file a specialised plan was partitioned with, checked to give the same shapes."""
    files = sorted({str(r.get("inputs_file")) for r in plan.specialised if r.get("inputs_file")})
    if not plan.specialised:
        return None
    if not files:
        raise UserError("--repartition: the plan was specialised to --inputs by an rkpart that did not record the "
                        "file; partition it again with rkpart partition --inputs")
    path = Path(files[0])
    if not path.is_file():
        raise UserError(f"--repartition: the plan was specialised to --inputs {path}, which is gone; partition it "
                        "again with rkpart partition --inputs")
    from rkpart.readers import read_npz

    plan.check_specialised(read_npz(path, what="--inputs file"))  # a changed file would change a shape
    return path


def graph_io_of(model: Path) -> dict[str, bool]:
    """Model input -> whether its shape has a symbolic dimension (what ``--shape`` had to fix)."""
    from rkpart.ir import graph_io

    return {t: any(d <= 0 for d in vt[1]) for t, vt in graph_io(model).inputs.items()}  # symbolic reads as 0
