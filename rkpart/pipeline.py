"""The partition pipeline: model file -> loaded graph -> partition -> plan folder.

Each step is a function of the previous step's value, so a caller that needs the graph for
something else (``rkpart inspect``, the drop-in's strategy choice) loads it once and hands it
on::

    model = load("model.onnx")                         # graph + discovery (on first use)
    part = propose(model, "auto", PartitionConfig(options={"budget_mib": 512}))
    plan = write_plan(model, part, "build/")           # crash-safe, resumable

:func:`partition` is those three calls.  ``auto`` lives here rather than in
:mod:`rkpart.strategies`: it asks the strategies for whole-model partitions, hands them to
the cost model as candidates (:mod:`rkpart.cost_model.candidates`) and assembles the
cost model's choice (:func:`rkpart.cost_model.select.choose`), so it sits above both.

Package layers (``tests/test_import_dag.py`` enforces them; a package imports only from
layers to its left, never back, not even inside a function)::

    errors, types <- io, units, progress
      <- ir <- targets <- partitioner <- plugins <- recognizers <- strategies
      <- validation <- compile <- runtime <- triage <- profile <- cost_model <- bundle, report
      <- pipeline <- tune <- dropin <- cli_args <- commands <- cli
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rkpart import strategies
from rkpart.cost_model.candidates import OWN_STRATEGIES, Candidate, Variant, block_anatomy, candidates_from
from rkpart.cost_model.model import CostModel, load_model_or_default
from rkpart.cost_model.select import RESIDENCIES, Selection, SelectionConfig, choose
from rkpart.errors import UserError
from rkpart.io import file_sha256, load_json_file
from rkpart.ir import ModelGraph, load_model
from rkpart.partitioner.capability import cut_before, flag_ops, place_by_capability
from rkpart.partitioner.coverage import Coverage, coverage_note, npu_coverage
from rkpart.partitioner.discovery import Discovery
from rkpart.partitioner.extract import DEFAULT_EXTERNAL_THRESHOLD
from rkpart.partitioner.partition import Partition, acyclic
from rkpart.partitioner.plan import Plan
from rkpart.partitioner.weights import WeightsMode
from rkpart.partitioner.write import prepare_out, write_partition
from rkpart.recognizers import discover
from rkpart.strategies.base import GroupBuilder, Strategy, check_strategy_options, option
from rkpart.strategies.fused import FusedStrategy
from rkpart.strategies.split import SplitStrategy
from rkpart.targets import DEFAULT_TARGET, TARGETS, get_target
from rkpart.targets.capability import Capability
from rkpart.targets.opset import lowering_note
from rkpart.targets.rewrites import rewrites_for

Progress = Callable[[str], None]


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
    from rkpart.io import read_npz
    from rkpart.runtime.specialise import load_specialised

    feeds = read_npz(inputs, what="--inputs file")
    mg = load_specialised(model, feeds, input_shapes=input_shapes)
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


def capability_for(config: PartitionConfig) -> Capability | None:
    """The capability ``config`` partitions with (``None``: off, or a target without a table)."""
    if not config.capability or config.target.lower() not in TARGETS:
        return None
    tgt = get_target(config.target)
    version = config.toolkit
    if version is not None and not version.replace(".", "").isdigit():
        from rkpart.compile.toolkits import find_toolkit

        version = find_toolkit(version).version  # a python path: the toolkit it runs
    caps = tgt.caps(version)
    learned: frozenset[Any] = frozenset()
    if config.learned:
        from rkpart.compile.learned import load_learned

        learned = load_learned(tgt.name, caps.version)
    return Capability(tgt.name, caps, learned, config.rewrites)


def propose(model: LoadedModel, strategy: str | Strategy, config: PartitionConfig = PartitionConfig()) -> Partition:
    """The partition ``strategy`` proposes for ``model``, checked against the target's capabilities."""
    strat = get_strategy(strategy) if isinstance(strategy, str) else strategy
    check_options(strat, config.options)
    disc = model.discovery(config.progress) if strat.needs_blocks else None
    # any strategy, plugins too: stages that feed each other are re-cut or merged (and noted),
    # before the capability pass, which relies on convex groups
    part = acyclic(model.graph, strat.propose(model.graph, disc, **config.options))
    for note in part.notes:
        if " cycle " in note:
            config.progress(note)
    cap = capability_for(config)
    if cap is not None:
        part = apply_capability(model.graph, part, cap, config.force_host, config.progress)
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
    for note in notes:
        config.progress(f"warning: {note}")
    if not any(g.device == "npu" for g in part.groups):
        # recorded in the plan's notes; the CLI warns on stderr even with --quiet
        notes.append(f"strategy {part.strategy} put no stage on the NPU: the whole model runs on the host")
    if notes:
        part = dataclasses.replace(part, notes=(*part.notes, *notes))
    return part


def apply_capability(mg: ModelGraph, part: Partition, cap: Capability, force_host: Mapping[str, str] | None = None,
                     progress: Progress = _noop) -> Partition:
    """``part`` with every op ``cap`` does not run on the NPU moved to the host (see
    :mod:`rkpart.partitioner.capability`), the moves recorded in ``extra.capability``."""
    flagged = flag_ops(mg, part, cap, force_host)
    if not flagged:
        return part
    out, moved = place_by_capability(mg, part, flagged)
    for h in moved:
        progress(f"capability: {h.op_type} {h.name} ({h.stage}) -> host: {h.why}")
    return dataclasses.replace(out, extra={**out.extra, "capability": {
        **cap.to_json(), "host_ops": [h.to_json() for h in moved]}})


def strategy_coverage(mg: ModelGraph, disc: Discovery) -> dict[str, Coverage]:
    """NPU coverage of the ``split`` and ``fused`` proposals (``rkpart inspect``)."""
    return {name: npu_coverage(mg, disc, cls().propose(mg, disc).groups)
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
    toolkit: str | None = None,
    inputs: str | os.PathLike[str] | None = None,
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
    toolkit:
        The rknn-toolkit2 version whose capability decides the grouping (default: the target's
        default toolkit); for ``auto`` also the toolkit whose known crashes exclude candidates.
    inputs:
        An ``.npz`` of representative model inputs: shapes that depend on the data are
        observed in one ONNX Runtime run on them and the plan is specialised to them
        (``plan.specialised``; ``docs/plan.md``).
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
    if toolkit is not None and strategy == "auto":
        options.setdefault("toolkit", toolkit)
    config = PartitionConfig(options=options, force=force, external_threshold=external_threshold,
                             simplify=simplify, progress=progress, weights=weights, toolkit=toolkit)
    return run_partition(PartitionOptions(Path(model), Path(out), strategy, config, input_shapes,
                                          Path(inputs) if inputs is not None else None))


def check_options(strategy: str | Strategy, options: Mapping[str, Any]) -> None:
    """Refuse options that do not fit ``strategy`` (the CLI's flags), before anything is loaded:
    :func:`~rkpart.strategies.base.check_strategy_options` with every registered strategy's
    options known, so that an option of another strategy is named as such.

    Raises
    ------
    UserError
        an option ``strategy`` does not read, or a missing one it requires.
    """
    strat = get_strategy(strategy) if isinstance(strategy, str) else strategy
    check_strategy_options(strat, options, known={n: c.accepts or () for n, c in available().items()})


# -- auto -----------------------------------------------------------------------------------

def candidate_variants(mg: ModelGraph, disc: Discovery, *, plugins_too: bool = True,
                       notes: list[str] | None = None) -> list[Variant]:
    """The whole-model partitions ``auto`` chooses from, as the strategies propose them.

    ``split`` (AdaLN on the host, or on the NPU), ``fused`` one block per stage, and every
    registered plugin strategy whose stages stay inside one block (``notes`` collects the
    plugins that were skipped and why).
    """
    out: list[Variant] = [
        ("split", SplitStrategy().propose(mg, disc), {"strategy": "split", "adaln": "host"}),
        ("split-adaln-npu", SplitStrategy().propose(mg, disc, adaln="npu"), {"strategy": "split", "adaln": "npu"}),
        ("fused", FusedStrategy().propose(mg, disc), {"strategy": "fused", "blocks_per_stage": 1}),
    ]
    if not plugins_too:
        return out
    sink = notes if notes is not None else []
    for name, cls in available().items():
        if name in OWN_STRATEGIES:
            continue
        try:
            part = acyclic(mg, cls().propose(mg, disc))  # as propose() makes every strategy's
        except Exception as e:  # noqa: BLE001 - a plugin that needs options it was not given is skipped, with a note
            sink.append(f"strategy {name} not considered: {type(e).__name__}: {e}")
            continue
        if any(len(g.blocks) > 1 for g in part.groups):
            sink.append(f"strategy {name} not considered: its stages span several blocks")
            continue
        out.append((name, part, {"strategy": name}))
    return out


def enumerate_candidates(mg: ModelGraph, disc: Discovery, *, max_run: int = 2, plugins_too: bool = True,
                         notes: list[str] | None = None) -> dict[int, list[Candidate]]:
    """Candidates per first block: :func:`candidate_variants` sliced per block, plus fused runs."""
    variants = candidate_variants(mg, disc, plugins_too=plugins_too, notes=notes)
    return candidates_from(mg, disc, variants, max_run=max_run)


def select(mg: ModelGraph, disc: Discovery, model: CostModel, config: SelectionConfig | None = None) -> Selection:
    """Choose a candidate partition and a residency per block of ``mg`` (``--strategy auto``).

    The candidates are :func:`candidate_variants` sliced per block plus runs of up to
    ``config.max_run`` fused blocks.
    """
    config = config or SelectionConfig()
    notes: list[str] = []
    cands = enumerate_candidates(mg, disc, max_run=config.max_run, plugins_too=config.plugins, notes=notes)
    anatomy = {b.index: block_anatomy(mg, b) for b in disc.blocks} if config.share_anatomy else None
    return choose(cands, model, config, notes=notes, anatomy=anatomy)


def auto_budget(options: Mapping[str, Any]) -> tuple[float | None, str]:
    """``auto``'s memory budget in MiB and where it came from.

    ``budget_mib`` given: that; ``"none"``: no budget (``--no-budget``); absent: the target's
    documented pipeline default (:meth:`rkpart.targets.base.Target.pipeline_budget_bytes`).
    """
    raw = options.get("budget_mib")
    if isinstance(raw, str) and raw.strip().lower() == "none":
        return None, "none"
    if raw is None:
        target = get_target(options.get("target"))
        return target.pipeline_budget_bytes() / float(1 << 20), target.describe_pipeline_budget()
    try:
        mib = float(raw)
    except (TypeError, ValueError):
        raise UserError(f"budget_mib must be a number of MiB or 'none', got {raw!r}") from None
    if not mib > 0:
        raise UserError(f"budget_mib must be > 0, got {mib:g}")
    return mib, "given"


#: the single-strategy candidate families ``auto`` compiles representatives of: (candidate id,
#: strategy, options); a run of K fused blocks is ``fused`` with ``blocks_per_stage=K``
GROUNDED: tuple[tuple[str, str, Mapping[str, Any]], ...] = (
    ("split", "split", {}),
    ("split-adaln-npu", "split", {"adaln": "npu"}),
    ("fused", "fused", {}),
)


def ground_candidates(mg: ModelGraph, disc: Discovery, toolkit: str, work: Path, *, max_run: int = 2,
                      toolkits_dir: str | None = None, progress: Progress = _noop) -> tuple[list[Path], list[str]]:
    """Compile one block per distinct anatomy of every candidate family with ``toolkit``, or take
    the builds from the user's build cache, so that ``auto`` chooses from the compiler's own tables.

    Each family's plan is written under ``work`` (weights linked, not copied); of its NPU stages
    only those of the first block of each anatomy (:func:`~rkpart.cost_model.candidates.block_anatomy`)
    are built.  Returns the compiled plan folders (``SelectionConfig.compiled``) and notes for the
    explanation.  A toolkit that is not installed gives no folders and a note saying so.
    """
    from rkpart.compile.compile import compile_plan_report
    from rkpart.compile.toolkits import find_toolkit
    from rkpart.errors import ToolkitError

    try:
        tk = find_toolkit(toolkit, toolkits_dir)
    except ToolkitError as e:
        return [], [f"candidates not compiled: {e}; device memory is predicted (rkpart toolkit install {toolkit})"]
    anatomy = {b.index: block_anatomy(mg, b) for b in disc.blocks}
    families = [*GROUNDED, *((f"fused-x{k}", "fused", {"blocks_per_stage": k}) for k in range(2, max_run + 1)
                             if k <= len(disc.blocks))]
    folders: list[Path] = []
    notes: list[str] = []
    for cid, strategy, opts in families:
        out = work / cid
        progress(f"auto: {cid}: partitioning to compile one block per anatomy")
        plan = partition(mg.path, out, strategy, force=True, weights="link", **opts)
        seen: set[tuple[tuple[str, ...], str]] = set()
        reps = []
        for st in plan.npu_stages:
            k = (tuple(anatomy.get(b, str(b)) for b in st.blocks), st.region)
            if st.blocks and k not in seen:
                seen.add(k)
                reps.append(st.id)
        if not reps:
            continue
        progress(f"auto: {cid}: compiling {len(reps)} representative stage(s) with rknn-toolkit2 {tk.version}")
        rep = compile_plan_report(plan, out, tk, stages=reps, progress=progress)
        failed = [o.stage_id for o in rep.failed]
        notes.append(f"{cid}: {len(reps)} stage(s) of {len({a for a in anatomy.values()})} block anatomy(ies) compiled "
                     f"with rknn-toolkit2 {tk.version} ({len(rep.cached)} from the build cache"
                     + (f"; failed: {', '.join(failed)}" if failed else "") + ")")
        folders.append(out)
    return folders, notes


def _as_bool(v: Any, name: str) -> bool:
    """A boolean option, also as the CLI's ``--option KEY=true|false`` string."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "1", "yes", "false", "0", "no"):
        return v.lower() in ("true", "1", "yes")
    raise UserError(f"auto strategy: option {name} must be true or false, not {v!r}")


def _as_list(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, (list, tuple)):
        return tuple(str(x) for x in v)
    return tuple(x for x in str(v).split(",") if x)


def load_accuracy(path: str | os.PathLike[str]) -> dict[str, Any]:
    """An accuracy term written by ``rkpart drift --accuracy FILE``, checked for the keys selection reads.

    Raises :class:`UserError` naming the file and what is wrong.
    """
    acc = load_json_file(path, what="accuracy term", max_bytes=1 << 20)
    fams = acc.get("families") if isinstance(acc, dict) else None
    floor = acc.get("default_max_ratio") if isinstance(acc, dict) else None
    if (not isinstance(fams, dict) or not fams or not isinstance(floor, (int, float)) or isinstance(floor, bool)
            or not math.isfinite(floor) or floor < 1
            or not all(isinstance(f, dict) and isinstance(f.get("ratio"), (int, float))
                       and not isinstance(f.get("ratio"), bool) and math.isfinite(f["ratio"]) and f["ratio"] >= 0
                       for f in fams.values())):
        raise UserError(f"accuracy term {path}: not an accuracy term written by `rkpart drift --accuracy` "
                        "(needs families with a finite ratio >= 0 and default_max_ratio >= 1)")
    from rkpart.cost_model.checks import check_accuracy
    from rkpart.errors import SpecError

    try:  # the rest of the table too: a NaN drift run's final cosine or MSE is no measurement
        check_accuracy(f"accuracy term {path}", acc)
    except SpecError as e:
        raise UserError(str(e)) from None
    return acc


class AutoStrategy(Strategy):
    """``auto``: per block, the candidate partition a cost model predicts to be fastest within budget.

    Options:

    ``cost_model``       path of a model JSON (default: the shipped RK3588 calibration)
    ``accuracy``         path of an accuracy term measured by ``rkpart drift --accuracy FILE``;
                         it replaces the cost model's (its per-family error ratios and floor)
    ``budget_mib``       memory budget of the whole pipeline in MiB: NPU device memory, or process
                         memory for a model fitted on ONNX Runtime; ``"none"``: no budget
                         (default: the target's, 4096 MiB for rk3588)
    ``toolkit``          rknn-toolkit2 version whose known crashes exclude candidates
                         (default: the cost model's)
    ``steps``, ``cfg``   pipeline shape: passes = steps x (2 if cfg else 1) (default 1, True)
    ``residency``        ``any`` (choose per block), ``per-stage`` or ``resident``
    ``max_error_ratio``  accuracy floor (default: the cost model's)
    ``max_run``          longest run of blocks fused into one stage (default 2)
    ``cfg_parallel``     plan for the bundle runner's ``--cfg-parallel`` (both CFG passes of a step at
                         once on two NPU cores): twice the device memory of every stage, NPU
                         inference at a published, unmeasured speed-up (default False)
    ``compiled``         plan folders compiled by ``rkpart compile``: their failures exclude
                         candidates, their ``.rknn`` sizes, compiler memory and cycles replace estimates
    ``compile``          compile one block per anatomy of every candidate family with ``toolkit``
                         (:func:`ground_candidates`; the build cache makes a rerun free), so that device
                         memory and NPU time come from the compiler's own tables (default False;
                         ``rkpart partition --toolkit V`` turns it on)
    ``toolkits_dir``     where toolkit environments live (for ``compile``)
    ``compile_dir``      where ``compile`` writes the candidate plans and keeps them (default: a
                         temporary folder, removed afterwards)
    ``report``           callable receiving the :class:`~rkpart.cost_model.select.Selection`
                         (the CLI's ``--explain``); not recorded in the plan
    ``progress``         callable receiving progress lines while candidates compile; not recorded
    """

    name = "auto"
    accepts = ("cost_model", "accuracy", "budget_mib", "toolkit", "steps", "cfg", "residency", "max_error_ratio",
               "max_run", "compiled", "compile", "toolkits_dir", "compile_dir", "cfg_parallel", "report", "progress")
    summary = "per block, the cheapest candidate predicted by a cost model within a memory budget"

    def propose(self, mg: ModelGraph, disc: Discovery | None, **options: Any) -> Partition:
        assert disc is not None
        model_path = options.get("cost_model")
        model = load_model_or_default(model_path)
        acc_path = options.get("accuracy")
        if acc_path is not None:
            model = dataclasses.replace(model, accuracy=load_accuracy(acc_path))
        residency = option(options, "residency", "any", ("any", *RESIDENCIES))
        budget, budget_source = auto_budget(options)
        try:
            cfg = SelectionConfig(
                budget_mib=budget, budget_source=budget_source,
                toolkit=None if options.get("toolkit") is None else str(options["toolkit"]),
                steps=int(option(options, "steps", 1)),
                cfg=bool(option(options, "cfg", True)),
                residencies=RESIDENCIES if residency == "any" else (residency,),
                max_error_ratio=None if options.get("max_error_ratio") is None else float(options["max_error_ratio"]),
                max_run=int(option(options, "max_run", 2)),
                compiled=_as_list(options.get("compiled")),
                cfg_parallel=_as_bool(options.get("cfg_parallel", False), "cfg_parallel"),
            )
        except (TypeError, ValueError) as e:
            raise UserError(f"auto strategy: bad option: {e}") from None
        grounding: list[str] = []
        with contextlib.ExitStack() as stack:
            if options.get("compile") and cfg.toolkit is not None:
                import tempfile

                from rkpart.compile.user_cache import default_cache_dir

                if options.get("compile_dir") is not None:
                    work = Path(str(options["compile_dir"]))
                else:
                    root = default_cache_dir()
                    root.mkdir(parents=True, exist_ok=True)
                    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="auto-", dir=root)))
                say: Progress = options.get("progress") or _noop
                folders, grounding = ground_candidates(mg, disc, cfg.toolkit, work, max_run=cfg.max_run,
                                                       toolkits_dir=options.get("toolkits_dir"), progress=say)
                cfg = dataclasses.replace(cfg, compiled=(*cfg.compiled, *map(str, folders)), share_anatomy=True)
            sel = select(mg, disc, model, cfg)
        plan_notes = tuple(sel.notes)
        sel.notes.extend(grounding)  # for --explain only: whether a build came from the cache is not the plan's
        report: Callable[[Any], None] | None = options.get("report")
        if report is not None:
            report(sel)
        gb = GroupBuilder()
        for o in sel.chosen:
            for g in o.candidate.groups:
                gb.add(g.id, set(g.ops), device=g.device, region=g.region, kind=g.kind, block=g.block,
                       blocks=g.blocks)
        gb.add_host_rest(mg, disc)
        recorded = {
            "cost_model": "shipped:rk3588_calibration" if model_path is None else str(model_path),
            "cost_model_sha256": model.sha256,
            **({} if acc_path is None else {"accuracy": str(acc_path),
                                            "accuracy_sha256": file_sha256(Path(acc_path))}),
            "budget_mib": cfg.budget_mib,
            "budget_source": cfg.budget_source,
            "toolkit": sel.toolkit,
            "steps": cfg.steps,
            "cfg": cfg.cfg,
            "residency": residency,
            "max_error_ratio": sel.max_error_ratio,
            "max_run": cfg.max_run,
            **({"cfg_parallel": True} if cfg.cfg_parallel else {}),
            "choices": [{"blocks": list(o.candidate.blocks), "candidate": o.candidate.id, "residency": o.residency}
                        for o in sel.chosen],
            "predicted_latency_s": round(sel.latency, 6),
            "predicted_device_mib": round(sel.device_bytes / 2**20, 2),
            "device_memory_source": sorted({src for o in sel.chosen for src in o.device_source.split("+")}),
        }
        notes = tuple(f"block {','.join(map(str, o.candidate.blocks))}: {o.candidate.id} ({o.residency})"
                      for o in sel.chosen) + plan_notes
        return gb.build(self.name, recorded, notes=notes)


#: every built-in strategy, in the order ``rkpart strategies`` lists them
BUILTIN: tuple[type[Strategy], ...] = (*strategies.BUILTIN, AutoStrategy)


__all__ = ["BUILTIN", "AutoStrategy", "LoadedModel", "PartitionConfig", "PartitionOptions", "auto_budget",
           "available", "candidate_variants", "capability_notes", "check_options", "enumerate_candidates",
           "get_strategy", "inspect_model", "load", "partition", "propose", "run_partition", "select",
           "strategy_coverage", "write_plan"]


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

    def describe(self) -> str:
        cut = (f"; {len(self.cut_before)} cut(s) in front of ops a crashed build fused, failed stages "
               f"{self.failed_before} -> {self.failed_after}") if self.cut_before else ""
        return (f"repartition round {self.round}: {len(self.moved)} op(s) the build put on the CPU moved to the "
                f"host; CPU layers in NPU stages {self.cpu_layers_before} -> {self.cpu_layers_after}{cut}; "
                f"{self.stages_built} stage(s) rebuilt")


#: rounds ``--repartition`` runs at most (each moves every op the last build put on the CPU)
MAX_REPARTITION_ROUNDS = 4
#: failures a cut can work around (the graph's fault); timeouts, OOM, disk and resource limits are the machine's
_CUTTABLE = ("crash", "error")


def crash_cuts(report: Any, folder: Path) -> dict[str, str]:
    """Op name -> why, for the ops the crashed builds of ``report`` fused just before they died.

    The crash's known issue names the optimiser rules that lead to it
    (:attr:`~rkpart.targets.known_issues.KnownIssue.fusion_rules`); an unknown crash suspects the
    last fusion rule its log shows.
    """
    from rkpart.targets.known_issues import fused_nodes, match_log

    out: dict[str, str] = {}
    for o in report.outcomes:
        if o.status != "failed" or not o.failures or o.failures[-1].kind not in _CUTTABLE:
            continue
        for f in o.failures:
            if f.kind not in _CUTTABLE or not f.log:
                continue
            try:
                text = (folder / f.log).read_text(errors="replace")
            except OSError:
                continue
            issue = match_log(text, signal=f.signal, toolkit=f.toolkit, kind=f.kind, exit_code=f.exit_code)
            for rule, name in fused_nodes(text, issue.fusion_rules if issue and issue.fusion_rules else None):
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
    from rkpart.compile.compile import compile_folder
    from rkpart.compile.learned import forced_host, traced_layers
    from rkpart.partitioner.plan import load_plan

    report = compile_folder(plan_path, opts, progress)
    _, folder = load_plan(plan_path)
    folder = Path(folder)
    forced: dict[str, str] = {}
    cuts: dict[str, str] = {}
    rounds: list[RepartitionRound] = []
    stuck: list[str] = []
    for r in range(1, max_rounds + 1):
        before = sum(len(o.cpu_ops) for o in report.outcomes)
        failed = len(report.failed)
        if not before and not failed:
            break
        layers = traced_layers(report, folder)
        stuck = sorted(f"{x.stage}: {x.layer}" for x in layers if x.op is None)
        new = {k: v for k, v in forced_host(layers).items() if k not in forced}
        new_cuts = {k: v for k, v in crash_cuts(report, folder).items() if k not in cuts}
        if not new and not new_cuts:
            break
        forced.update(new)
        cuts.update(new_cuts)
        progress(f"repartition round {r}: moving {len(new)} op(s) the build put on the CPU to the host, cutting "
                 f"in front of {len(new_cuts)} op(s) a failed build fused")
        _write_again(report.plan, folder, opts, forced, cuts, progress)
        report = compile_folder(folder, opts, progress)
        after = sum(len(o.cpu_ops) for o in report.outcomes)
        rounds.append(RepartitionRound(r, tuple(sorted(new)), before, after, len(report.built),
                                       tuple(sorted(new_cuts)), failed, len(report.failed)))
        stuck = []
    if sum(len(o.cpu_ops) for o in report.outcomes) and not stuck:
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
    loaded = load(model, shapes or None, progress)
    config = PartitionConfig(options=options, force=True, target=opts.target, toolkit=opts.toolkit,
                             rewrites=opts.rewrites, force_host=forced, cut_before=cuts, progress=progress,
                             weights="link" if "weights" in plan.extra else "copy")
    write_plan(loaded, propose(loaded, strat, config), folder, config)


def graph_io_of(model: Path) -> dict[str, bool]:
    """Model input -> whether its shape has a symbolic dimension (what ``--shape`` had to fix)."""
    from rkpart.ir import graph_io

    return {t: any(d <= 0 for d in vt[1]) for t, vt in graph_io(model).inputs.items()}  # symbolic reads as 0
