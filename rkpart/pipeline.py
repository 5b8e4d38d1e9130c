"""The partition pipeline: model file -> loaded graph -> proposal -> plan folder.

Each step is a function of the previous step's value, so a caller that needs the graph for
something else (``rkpart inspect``, the drop-in's strategy choice) loads it once and hands it
on::

    model = load("model.onnx")                            # graph + discovery (on first use)
    proposal = propose(model, "auto", PartitionConfig(options={"budget_mib": 512}))
    plan = write_plan(model, proposal, "build/")          # crash-safe, resumable

:func:`partition` is those three calls.  The steps live in the packages named after them
(:mod:`rkpart.discovery` finds the blocks, :mod:`rkpart.grouping` chooses the groups,
:mod:`rkpart.plan` writes them); this module is their face: it resolves names and options, and
hands each step the value of the one before.  ``auto`` (:mod:`rkpart.auto`) is not in
:mod:`rkpart.grouping.strategies`: it asks the strategies for whole-model partitions, hands them
to the cost model as candidates and assembles the cost model's choice, so it sits above both,
and below this module, which lists it among the built-in strategies and runs its compile step
(:mod:`rkpart.grounding`).  ``compile --repartition`` is :mod:`rkpart.repartition`, above.

Package layers (``tests/test_import_dag.py`` enforces them; a package imports only from
layers to its left, never back, not even inside a function)::

    errors, types <- io, output, units, progress, description <- export
      <- ir <- targets <- plugins <- discovery <- grouping <- plan
      <- validation, roles <- compile <- runtime <- triage <- profile <- cost_model <- bundle, report
      <- auto <- grounding <- pipeline <- repartition <- tune <- dropin <- cli_args <- commands <- cli
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rkpart.auto import AutoStrategy
from rkpart.description import PipelineDescription
from rkpart.discovery.recognizers import discover_with_progress
from rkpart.discovery.structure import Discovery
from rkpart.grouping import strategies
from rkpart.grouping.capability import apply_capability, capability_notes
from rkpart.grouping.learned import target_capability
from rkpart.grouping.propose import Placement, Proposal
from rkpart.grouping.propose import propose as propose_groups
from rkpart.grouping.strategies.base import Strategy, check_strategy_options
from rkpart.ir import ModelGraph, load_model
from rkpart.plan.extract import DEFAULT_EXTERNAL_THRESHOLD
from rkpart.plan.plan import Plan
from rkpart.plan.weights import WeightsMode
from rkpart.plan.write import StageFiles, prepare_out, write_partition
from rkpart.progress import Progress, silent
from rkpart.targets import DEFAULT_TARGET, TARGETS
from rkpart.targets.capability import Capability
from rkpart.types import JsonMap

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

    def discovery(self, progress: Progress = silent) -> Discovery:
        """Blocks and regions (recognisers included); raises :class:`~rkpart.errors.DiscoveryError`."""
        if self._discovery is None:
            self._discovery = discover_with_progress(self.graph, progress)
        return self._discovery


def load(
    model: str | os.PathLike[str],
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    progress: Progress = silent,
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
    :mod:`rkpart.grouping.learned`) -- leave NPU stages unless one of its rewrites removes them
    (``rewrites=False``: the build will apply none).  ``force_host`` names ops (by node name)
    that leave NPU stages whatever the rewrites do, with why: ``rkpart compile --repartition``
    passes the layers the last build of the plan put on the CPU.  ``capability=False`` turns
    all of it off (the strategy's grouping is written as proposed).
    """

    options: JsonMap = field(default_factory=dict)
    force: bool = False
    external_threshold: int = DEFAULT_EXTERNAL_THRESHOLD
    simplify: bool = False
    weights: WeightsMode = "copy"
    target: str = DEFAULT_TARGET
    toolkit: str | None = None
    progress: Progress = field(default=silent, compare=False)
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


def placement_of(config: PartitionConfig) -> Placement:
    """What decides where ops run, from ``config``: its toolkit as a version (a python path is asked
    which it has: :func:`rkpart.compile.toolkits.toolkit_version`), only when a capability is used."""
    version = None
    if config.capability and config.target.lower() in TARGETS:  # no table: the toolkit spec is not resolved
        from rkpart.compile.toolkits import toolkit_version

        version = toolkit_version(config.toolkit)
    return Placement(target=config.target, toolkit=config.toolkit, version=version, capability=config.capability,
                     learned=config.learned, rewrites=config.rewrites, force_host=config.force_host,
                     cut_before=config.cut_before)


def capability_for(config: PartitionConfig) -> Capability | None:
    """The capability ``config`` partitions with (``None``: off, or a target without a table)."""
    p = placement_of(config)
    return target_capability(p.target, p.version, learned=p.learned, rewrites=p.rewrites) if p.capability else None


def propose(model: LoadedModel, strategy: str | Strategy, config: PartitionConfig = PartitionConfig()) -> Proposal:
    """The partition ``strategy`` proposes for ``model``, checked against the target's capabilities
    (:func:`rkpart.grouping.propose.propose`), with the graph it is of: ``model`` is not changed.

    ``auto`` is asked through :func:`rkpart.grounding.auto_grouping`, which compiles its
    representative candidates first when its options say so.
    """
    strat = get_strategy(strategy) if isinstance(strategy, str) else strategy
    opts = check_options(strat, config.options)
    group = None
    if isinstance(strat, AutoStrategy):
        from rkpart.grounding import auto_grouping

        group = auto_grouping(strat, opts)
    proposal = propose_groups(model.graph, strat, opts, placement_of(config), discovery=model._discovery,
                              group=group, progress=config.progress)
    if proposal.graph is model.graph and model._discovery is None:
        model._discovery = proposal.discovery  # the next proposal of the same graph reads it again
    return proposal


def write_plan(model: LoadedModel, proposal: Proposal, out: str | os.PathLike[str],
               config: PartitionConfig = PartitionConfig(), description: PipelineDescription | None = None) -> Plan:
    """Write ``proposal`` as the plan folder ``out``: its partition, cut from the graph it is of
    (:func:`rkpart.plan.write.write_partition`), with ``description`` (the pipeline's
    ``pipeline.json``) recorded in it."""
    from rkpart.roles import description_attacher, record_description

    simplify = None
    if config.simplify:
        from rkpart.runtime.simplify import simplify_stage  # onnxsim and ONNX Runtime: only when asked

        simplify = simplify_stage
    files = StageFiles(weights=config.weights, external_threshold=config.external_threshold, simplify=simplify)
    return write_partition(proposal.graph, proposal.discovery, record_description(proposal.partition, description),
                           out, force=config.force, input_shapes=model.input_shapes, files=files,
                           progress=config.progress, attach=description_attacher(description))


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


#: the fields of :class:`PartitionConfig` that :func:`partition` takes as its own keywords
_PARTITION_KEYWORDS = ("options", "force", "progress", "weights")
#: former keywords of :func:`partition`, now only fields of its ``config``
_CONFIG_ONLY = ("external_threshold", "simplify", "pipeline")


def partition(
    model: str | os.PathLike[str],
    out: str | os.PathLike[str],
    strategy: str | Strategy = "split",
    *,
    force: bool = False,
    progress: Progress = silent,
    weights: WeightsMode = "copy",
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    config: PartitionConfig | None = None,
    **options: Any,
) -> Plan:
    """Partition ``model`` with ``strategy`` and write the plan folder ``out``.

    The keyword form of :func:`run_partition` (which ``rkpart partition`` calls with one
    :class:`PartitionOptions`): the common settings are keywords, the rest is ``config``.

    Parameters
    ----------
    model:
        ONNX file (inline weights or external data; any size).
    out:
        Plan folder to create.  An existing non-empty one is replaced only with ``force``,
        and only once the new plan is complete.
    strategy:
        ``split``, ``fused``, ``custom``, ``generic``, ``auto``, any registered strategy, or a
        :class:`~rkpart.grouping.strategies.base.Strategy` instance (one not registered as a plugin).
    weights:
        ``copy`` (each stage gets its own data file) or ``link`` (no weights copied: stages
        reference the source's external data, linked into the plan folder).
    input_shapes:
        Static shapes for inputs with symbolic dimensions.
    config:
        The rarely needed settings (:class:`PartitionConfig`), e.g. ``simplify=True`` (onnxsim
        on every NPU stage, kept only when its outputs equal the original's under ONNX Runtime),
        ``external_threshold`` (a stage's weights over this many bytes go to a data file beside
        it), ``pipeline`` (the ``pipeline.json`` to record in the plan, checked against the
        model's inputs [default: the one beside the model, if there is one]), ``target``.
        Its ``options``, ``force``, ``progress`` and ``weights`` are this function's keywords:
        a ``config`` that sets one is refused (``TypeError``).
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
    moved = sorted(set(options) & set(_CONFIG_ONLY))
    if moved:  # keywords of partition() before it took a config: say where they went, not "unknown option"
        raise TypeError(f"partition() takes {', '.join(moved)} in config=PartitionConfig(...), not as keyword(s)")
    base = PartitionConfig() if config is None else config
    given = [k for k in _PARTITION_KEYWORDS if getattr(base, k) != getattr(PartitionConfig(), k)]
    if given:
        raise TypeError(f"partition() takes {', '.join(given)} as keyword(s), not in config")
    toolkit = options.get("toolkit") if strategy == "auto" else options.pop("toolkit", None)
    if toolkit is not None and base.toolkit is not None:
        raise TypeError("partition() got toolkit both as a keyword and in config")
    inputs = options.pop("inputs", None)
    how = dataclasses.replace(base, options=options, force=force, progress=progress, weights=weights,
                              toolkit=base.toolkit if toolkit is None else toolkit)
    return run_partition(PartitionOptions(Path(model), Path(out), strategy, how, input_shapes,
                                          Path(inputs) if inputs is not None else None))


def check_options(strategy: str | Strategy, options: JsonMap) -> Any:
    """Refuse options that do not fit ``strategy`` (the CLI's flags), before anything is loaded:
    :func:`~rkpart.grouping.strategies.base.check_strategy_options` with every registered strategy's
    options known, so that an option of another strategy is named as such; then the strategy's
    own checks.  Returns the options built (:meth:`~rkpart.grouping.strategies.base.Strategy.options_from`).

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


__all__ = ["BUILTIN", "LoadedModel", "PartitionConfig", "PartitionOptions", "Proposal", "apply_capability",
           "available", "capability_for", "capability_notes", "check_options", "get_strategy", "inspect_model",
           "load", "partition", "placement_of", "propose", "run_partition", "write_plan"]
