"""``--strategy auto``: per block, the candidate partition a cost model predicts to be fastest.

The families of :mod:`rkpart.grouping.strategies.families` propose whole-model partitions
(:func:`candidate_variants`); :mod:`rkpart.cost_model.candidates` slices them into
candidates per block and run, :func:`rkpart.cost_model.select.choose` chooses, and
:class:`AutoStrategy` assembles the choice.  Like every strategy it only groups: it compiles,
calibrates and writes nothing.  With a toolkit, the pipeline compiles one block per anatomy of
every family first (:mod:`rkpart.grounding`) and hands the builds to :meth:`AutoStrategy.choose`,
so that the choice reads the compiler's own tables.  It sits above the strategies and the cost
model, below :mod:`rkpart.pipeline` (which lists ``auto`` among the built-in strategies).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rkpart.cost_model.candidates import Candidate, Variant, block_anatomy, candidates_from
from rkpart.cost_model.features import group_features
from rkpart.cost_model.model import Accuracy, CostModel, load_model_or_default
from rkpart.cost_model.select import RESIDENCIES, Selection, SelectionConfig, Trade, choose, evaluate
from rkpart.discovery.structure import Discovery
from rkpart.errors import UserError
from rkpart.grouping import strategies
from rkpart.grouping.capability import apply_capability, flag_ops
from rkpart.grouping.groups import Partition, acyclic
from rkpart.grouping.learned import target_capability
from rkpart.grouping.strategies.base import GroupBuilder, Strategy, option, propose_with
from rkpart.grouping.strategies.families import OWN_STRATEGIES, families
from rkpart.io import file_sha256
from rkpart.ir import ModelGraph
from rkpart.progress import Progress, silent
from rkpart.readers import FileKind
from rkpart.targets import get_target
from rkpart.targets.capability import Capability
from rkpart.types import JsonMap, JsonObject


def candidate_variants(mg: ModelGraph, disc: Discovery, *, max_run: int = 1, plugins_too: bool = True,
                       notes: list[str] | None = None, capability: Capability | None = None) -> list[Variant]:
    """The whole-model partitions ``auto`` chooses from, as the strategies propose them.

    The families of :mod:`rkpart.grouping.strategies.families`: ``split`` (AdaLN on the host, or on the
    NPU), ``fused`` one block per stage, then every registered plugin strategy whose stages
    stay inside one block (``notes`` collects the plugins that were skipped and why), then
    the runs of K = 2 .. ``max_run`` fused blocks (one partition per start offset).  With a
    ``capability``, every partition has the ops that toolkit does not run on the NPU moved to
    the host first (:func:`~rkpart.grouping.capability.apply_capability`), so the cost model
    scores the stages that will be built.
    """
    def capable(part: Partition) -> Partition:
        return part if capability is None else apply_capability(mg, part, capability)

    fams = families(max_run, len(disc.blocks))
    out: list[Variant] = [(f.id, capable(part), f.recorded) for f in fams if f.blocks_per_stage == 1
                          for part in f.propose(mg, disc)]
    runs: list[Variant] = [(f.id, capable(part), f.recorded) for f in fams if f.blocks_per_stage > 1
                           for part in f.propose(mg, disc)]
    if not plugins_too:
        return out + runs
    sink = notes if notes is not None else []
    for name, cls in strategies.available().items():
        if name in OWN_STRATEGIES:
            continue
        try:
            part = acyclic(mg, propose_with(cls(), mg, disc))  # as propose() makes every strategy's
        except Exception as e:  # noqa: BLE001 - a plugin that needs options it was not given is skipped, with a note
            sink.append(f"strategy {name} not considered: {type(e).__name__}: {e}")
            continue
        if any(len(g.blocks) > 1 for g in part.groups):
            sink.append(f"strategy {name} not considered: its stages span several blocks")
            continue
        out.append((name, capable(part), {"strategy": name}))
    return out + runs


def enumerate_candidates(mg: ModelGraph, disc: Discovery, *, max_run: int = 2, plugins_too: bool = True,
                         notes: list[str] | None = None,
                         capability: Capability | None = None) -> dict[int, list[Candidate]]:
    """Candidates per first block: :func:`candidate_variants` sliced per block and per run."""
    variants = candidate_variants(mg, disc, max_run=max_run, plugins_too=plugins_too, notes=notes,
                                  capability=capability)
    return candidates_from(mg, disc, variants)


def select(mg: ModelGraph, disc: Discovery, model: CostModel, config: SelectionConfig | None = None,
           capability: Capability | None = None, *, trades: bool = True) -> Selection:
    """Choose a candidate partition and a residency per block of ``mg`` (``--strategy auto``).

    The candidates are :func:`candidate_variants` sliced per block plus runs of up to
    ``config.max_run`` fused blocks.  With ``trades`` (the default; the explanation shows them),
    each choice the ``capability`` moved ops out of is weighed against the runtime's CPU fallback
    (:func:`capability_trades`: every family proposed again).
    """
    config = config or SelectionConfig()
    notes: list[str] = []
    cands = enumerate_candidates(mg, disc, max_run=config.max_run, plugins_too=config.plugins, notes=notes,
                                 capability=capability)
    anatomy = {b.index: block_anatomy(mg, b) for b in disc.blocks} if config.share_anatomy else None
    sel = choose(cands, model, config, notes=notes, anatomy=anatomy)
    if trades and capability is not None and any(o.candidate.host_ops for o in sel.chosen):
        sel.trades = capability_trades(mg, disc, model, config, sel, capability)
    return sel


def capability_trades(mg: ModelGraph, disc: Discovery, model: CostModel, config: SelectionConfig, sel: Selection,
                      capability: Capability) -> dict[int, Trade]:
    """Per chosen candidate that had ops moved to the host: the same candidate without the move,
    its CPU ops (as the capability flags them) left to the runtime's fallback, costed by ``model``
    under the same residency (:class:`~rkpart.cost_model.select.Trade`)."""
    kept = enumerate_candidates(mg, disc, max_run=config.max_run, plugins_too=config.plugins)
    out: dict[int, Trade] = {}
    for o in sel.chosen:
        if not o.candidate.host_ops:
            continue
        same = next((c for c in kept.get(o.candidate.start, ()) if c.id == o.candidate.id
                     and c.blocks == o.candidate.blocks), None)
        if same is None:
            continue
        flagged = flag_ops(mg, Partition(o.candidate.id, {}, same.groups), capability)
        if not flagged:
            continue
        fb = evaluate(same, o.residency, model, config, sel.max_error_ratio)
        cpu = model.predict_stage(group_features(mg, set(flagged), device="host")).get("host") or 0.0
        out[o.candidate.start] = Trade(ops=tuple(mg.op(i).op_type for i in sorted(flagged)), moved=o, fallback=fb,
                                       fallback_cpu_s=float(cpu) * config.passes)
    return out


def auto_budget(options: JsonMap) -> tuple[float | None, str]:
    """``auto``'s memory budget in MiB and where it came from.

    ``budget_mib`` given: that; ``"none"``: no budget (``--no-budget``); absent: the default
    target's documented pipeline default (:meth:`rkpart.targets.base.Target.pipeline_budget_bytes`;
    ``auto`` takes no ``target`` option).
    """
    raw = options.get("budget_mib")
    if isinstance(raw, str) and raw.strip().lower() == "none":
        return None, "none"
    if raw is None:
        target = get_target()
        return target.pipeline_budget_bytes() / float(1 << 20), target.describe_pipeline_budget()
    try:
        mib = float(raw)
    except (TypeError, ValueError):
        raise UserError(f"budget_mib must be a number of MiB or 'none', got {raw!r}") from None
    if not mib > 0:
        raise UserError(f"budget_mib must be > 0, got {mib:g}")
    return mib, "given"


def _as_bool(v: object, name: str) -> bool:
    """A boolean option, also as the CLI's ``--option KEY=true|false`` string."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "1", "yes", "false", "0", "no"):
        return v.lower() in ("true", "1", "yes")
    raise UserError(f"auto strategy: option {name} must be true or false, not {v!r}")


def _as_list(v: object) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, (list, tuple)):
        return tuple(str(x) for x in v)
    return tuple(x for x in str(v).split(",") if x)


def _precisions(v: object) -> tuple[str, ...]:
    """``precisions`` (``fp16``, ``int8`` or ``fp16,int8``), in that order; default fp16 only."""
    from rkpart.grouping.strategies.families import CANDIDATE_PRECISIONS

    got = _as_list(v) or ("fp16",)
    bad = [p for p in got if p not in CANDIDATE_PRECISIONS]
    if bad:
        raise UserError(f"auto strategy: option precisions: {bad[0]!r} is not one of "
                        f"{', '.join(CANDIDATE_PRECISIONS)} (hybrid is built by `rkpart compile`, not chosen by auto)")
    return tuple(p for p in CANDIDATE_PRECISIONS if p in got)


#: ``partition -s auto --accuracy FILE``: the table ``rkpart drift --accuracy`` writes
ACCURACY_KIND = FileKind("accuracy term", "json", 1 << 20, UserError,
                         doc="`partition -s auto --accuracy`: the table `rkpart drift --accuracy` writes")


def load_accuracy(path: str | os.PathLike[str]) -> JsonObject:
    """An accuracy term written by ``rkpart drift --accuracy FILE``, checked for the keys selection reads.

    Raises :class:`UserError` naming the file and what is wrong.
    """
    acc = ACCURACY_KIND.load(path)
    from rkpart.cost_model.checks import check_numbers
    from rkpart.errors import SpecError

    try:  # every number finite and at most 2^53 in size (a 1e300 ratio is no measured drift)
        check_numbers(f"accuracy term {path}", acc)
    except SpecError as e:
        raise UserError(str(e)) from None
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

    try:  # the rest of the table too: a NaN drift run's final cosine or MSE is no measurement
        check_accuracy(f"accuracy term {path}", acc)
    except SpecError as e:
        raise UserError(str(e)) from None
    return acc


@dataclass(frozen=True)
class AutoOptions:
    """``auto``'s options, converted and checked once (see :class:`AutoStrategy` for each)."""

    cost_model: str | None = None
    accuracy: str | None = None
    budget_mib: float | None = None  # None: no budget (``budget_mib="none"``)
    budget_source: str = "given"
    toolkit: str | None = None
    steps: int = 1
    cfg: bool = True
    residency: str = "any"
    max_error_ratio: float | None = None
    max_run: int = 2
    compiled: tuple[str, ...] = ()
    cfg_parallel: bool = False
    compile: bool = False
    toolkits_dir: str | None = None
    compile_dir: str | None = None
    capability: bool = True
    precisions: tuple[str, ...] = ("fp16",)

    @classmethod
    def from_mapping(cls, options: JsonMap) -> AutoOptions:
        residency = option(options, "residency", "any", ("any", *RESIDENCIES))
        budget, budget_source = auto_budget(options)
        try:
            return cls(
                cost_model=None if options.get("cost_model") is None else str(options["cost_model"]),
                accuracy=None if options.get("accuracy") is None else str(options["accuracy"]),
                budget_mib=budget, budget_source=budget_source,
                toolkit=None if options.get("toolkit") is None else str(options["toolkit"]),
                steps=int(option(options, "steps", 1)),
                cfg=bool(option(options, "cfg", True)),
                residency=residency,
                max_error_ratio=None if options.get("max_error_ratio") is None else float(options["max_error_ratio"]),
                max_run=int(option(options, "max_run", 2)),
                compiled=_as_list(options.get("compiled")),
                capability=_as_bool(options.get("capability", True), "capability"),
                cfg_parallel=_as_bool(options.get("cfg_parallel", False), "cfg_parallel"),
                compile=bool(options.get("compile")),
                toolkits_dir=None if options.get("toolkits_dir") is None else str(options["toolkits_dir"]),
                compile_dir=None if options.get("compile_dir") is None else str(options["compile_dir"]),
                precisions=_precisions(options.get("precisions")),
            )
        except (TypeError, ValueError) as e:
            raise UserError(f"auto strategy: bad option: {e}") from None


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
    ``max_error_ratio``  accuracy floor, also the drift bound of int8 candidates: their measured final
                         latent MSE over the fp16 baseline's (default: the cost model's floor, which
                         int8 rows never widen)
    ``precisions``       ``fp16`` (default), ``int8`` or ``fp16,int8``: the precisions every candidate with
                         NPU stages is considered in, per block; int8 only where the accuracy term has
                         its measured drift (``rkpart drift --accuracy``) within ``max_error_ratio``
    ``max_run``          longest run of blocks fused into one stage (default 2)
    ``cfg_parallel``     plan for the bundle runner's ``--cfg-parallel`` (both CFG passes of a step at
                         once on two NPU cores): twice the device memory of every stage, NPU
                         inference at a published, unmeasured speed-up (default False)
    ``compiled``         plan folders compiled by ``rkpart compile``: their failures exclude
                         candidates, their ``.rknn`` sizes, compiler memory and cycles replace estimates
    ``compile``          compile one block per anatomy of every candidate family with ``toolkit``
                         (:func:`rkpart.grounding.ground_candidates`, the pipeline's step before the
                         choice; the build cache makes a rerun free), so that device
                         memory and NPU time come from the compiler's own tables (default False;
                         ``rkpart partition --toolkit V`` turns it on)
    ``toolkits_dir``     where toolkit environments live (for ``compile``)
    ``capability``       score every candidate with the ops the toolkit (default: the target's)
                         does not run on the NPU already on the host (default true)
    ``compile_dir``      where ``compile`` writes the candidate plans and keeps them (default: a
                         temporary folder under the user cache, removed afterwards; there each family's
                         linked weights go as soon as it is built)

    Not options (nothing a plan records), but arguments of the strategy itself: ``report``,
    a callable receiving the :class:`~rkpart.cost_model.select.Selection` (the CLI's
    ``--explain``), and ``progress``, receiving progress lines while candidates compile.
    """

    name = "auto"
    accepts = ("cost_model", "accuracy", "budget_mib", "toolkit", "steps", "cfg", "residency", "max_error_ratio",
               "max_run", "compiled", "compile", "toolkits_dir", "compile_dir", "cfg_parallel", "capability",
               "precisions")
    summary = "per block, the cheapest candidate predicted by a cost model within a memory budget"
    Options = AutoOptions

    def __init__(self, report: Callable[[Selection], None] | None = None, progress: Progress = silent) -> None:
        self.report = report
        self.progress = progress

    def propose(self, mg: ModelGraph, disc: Discovery | None, opts: AutoOptions) -> Partition:
        """The choice, from the cost model's predictions and ``opts.compiled`` builds only: ``compile``
        is the pipeline's step before it (:func:`rkpart.grounding.auto_grouping`), which hands the
        builds to :meth:`choose`."""
        assert disc is not None
        model = self.cost_model(opts)
        # the candidates are scored as they will be built: ops the toolkit runs on the CPU on the host
        cap = target_capability(get_target().name, opts.toolkit) if opts.capability else None
        return self.choose(mg, disc, opts, model, capability=cap)

    @staticmethod
    def cost_model(opts: AutoOptions) -> CostModel:
        """The cost model ``opts`` name (default: the shipped calibration), with its accuracy term replaced by
        ``opts.accuracy``'s.  Raises :class:`~rkpart.errors.UserError` for a file that is not one."""
        model = load_model_or_default(opts.cost_model)
        if opts.accuracy is not None:
            model = dataclasses.replace(model, accuracy=Accuracy(load_accuracy(opts.accuracy)))
        return model

    def choose(self, mg: ModelGraph, disc: Discovery, opts: AutoOptions, model: CostModel, *,
               capability: Capability | None, grounded: Grounded | None = None) -> Partition:
        """The groups of the candidate ``model`` chooses per block, scored with ``capability``'s moves
        made; ``grounded``: the compiled representative candidates (their tables replace predictions)."""
        residency = opts.residency
        cfg = SelectionConfig(
            budget_mib=opts.budget_mib, budget_source=opts.budget_source, toolkit=opts.toolkit, steps=opts.steps,
            cfg=opts.cfg, residencies=RESIDENCIES if residency == "any" else (residency,),
            max_error_ratio=opts.max_error_ratio, max_run=opts.max_run, compiled=opts.compiled,
            cfg_parallel=opts.cfg_parallel, precisions=opts.precisions,
        )
        if grounded is not None:
            cfg = dataclasses.replace(cfg, compiled=(*cfg.compiled, *grounded.folders), share_anatomy=True)
        # the trades are for --explain only (proposing every family again): made when someone reads the selection
        sel = select(mg, disc, model, cfg, capability=capability, trades=self.report is not None)
        plan_notes = tuple(sel.notes)
        if grounded is not None:  # for --explain only: whether a build came from the cache is not the plan's
            sel.notes.extend(grounded.notes)
        if self.report is not None:
            self.report(sel)
        gb = GroupBuilder()
        for o in sel.chosen:
            for g in o.candidate.groups:
                gb.add(g.id, set(g.ops), device=g.device, region=g.region, kind=g.kind, block=g.block,
                       blocks=g.blocks)
        gb.add_host_rest(mg, disc)
        model_path, acc_path = opts.cost_model, opts.accuracy
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
            **({} if cfg.precisions == ("fp16",) else {"precisions": list(cfg.precisions),
                                                        "precision": precision_spec(sel)}),
        }
        notes = tuple(f"block {','.join(map(str, o.candidate.blocks))}: {o.candidate.id} ({o.residency})"
                      for o in sel.chosen) + plan_notes
        part = gb.build(self.name, recorded, notes=notes)
        moved = [h for o in sel.chosen for h in o.candidate.host_ops]
        if capability is not None and moved:
            # the moves were made in the candidates it was assembled from: the plan records them
            # as any strategy's plan does (``extra.capability``)
            part = dataclasses.replace(part, extra={**part.extra,
                                                    "capability": {**capability.to_json(), "host_ops": moved}})
        return part


@dataclass(frozen=True)
class Grounded:
    """What compiling one block per anatomy of every candidate family gave (:mod:`rkpart.grounding`):
    the compiled plan folders, read as ``compiled`` builds that stand for every block of their
    anatomy, and notes for the explanation."""

    folders: tuple[str, ...]
    notes: tuple[str, ...]


def precision_spec(sel: Selection) -> JsonObject:
    """The chosen precision as a ``--precision-spec`` (``stages: {id: int8}``; stages not named are
    fp16), recorded in plan.json so that ``rkpart compile PLAN --calibration CALIB`` builds it."""
    return {"stages": {g.id: o.candidate.precision for o in sel.chosen if o.candidate.precision != "fp16"
                       for g in o.candidate.groups if g.device == "npu"}}


__all__ = ["AutoOptions", "AutoStrategy", "Grounded", "auto_budget", "candidate_variants", "enumerate_candidates",
           "load_accuracy", "precision_spec", "select"]
