"""``rkpart compile --repartition``: partition again from what the plan's own builds did.

The loop sits above the pipeline and the compiler: build the plan, move every op a build put on
the CPU to the host and cut in front of the ops a crashed build fused, write the plan again with
its strategy (:mod:`rkpart.pipeline`: load, propose, write), and build what changed; until
nothing is left to fix, or the rounds run out (the best round's plan is the one kept).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rkpart.compile.compile import CompileOptions, CompileReport, compile_folder, learn_placements, traced_layers
from rkpart.compile.toolkits import Toolkit
from rkpart.errors import UserError
from rkpart.grouping.learned import CpuLayer, forced_host
from rkpart.io import file_sha256
from rkpart.ir import graph_io
from rkpart.pipeline import PartitionConfig, available, get_strategy, load, propose, write_plan
from rkpart.plan.plan import Plan, load_plan
from rkpart.progress import Progress, silent
from rkpart.readers import read_npz
from rkpart.triage import isolate


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


def crash_cuts(report: CompileReport, folder: Path, stages: set[str] | None = None) -> dict[str, str]:
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


def compile_repartition(plan_path: str | os.PathLike[str], opts: CompileOptions, progress: Progress = silent,
                        max_rounds: int = MAX_REPARTITION_ROUNDS
                        ) -> tuple[CompileReport, list[RepartitionRound], list[str]]:
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
    _, folder = load_plan(plan_path)
    folder = Path(folder)
    quiet = dataclasses.replace(opts, learn=False)  # learned below, from the layers this loop traces once

    def build() -> tuple[CompileReport, list[CpuLayer]]:
        rep = compile_folder(folder, quiet, progress)
        return rep, (learn_placements(rep, folder, opts.target, progress) if opts.learn
                     else traced_layers(rep, folder))

    report, layers = build()
    forced: dict[str, str] = {}
    cuts: dict[str, str] = {}
    rounds: list[RepartitionRound] = []

    def badness(rep: CompileReport) -> tuple[int, int, int]:  # failed stages, then CPU layers, then stages
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


def compile_reducing_hangs(plan_path: str | os.PathLike[str], opts: CompileOptions, progress: Progress = silent
                           ) -> tuple[CompileReport, list[RepartitionRound]]:
    """``rkpart compile`` without ``--repartition``: compile the plan, and reduce the stages whose builds
    did not return as ``--repartition`` reduces a hang.

    A build that runs far past its peers is stopped and retried with the workaround its log names by the
    compile itself (:mod:`rkpart.compile.hang`); a stage that still does not return (stopped, or killed at
    ``--timeout``) is reduced to the ops that hang its build alone (:func:`rkpart.triage.isolate.failing_ops`);
    they go to the host, the plan's model is partitioned again into the plan folder with its strategy and
    options (the moves and cuts the plan already has kept), and the plan is compiled again, only the
    stages that changed built.  One round: crashes, errors and CPU layers are left to ``--repartition``.

    Returns the last compile report and the round (none when nothing hung, or nothing was found).
    """
    _, folder = load_plan(plan_path)
    folder = Path(folder)
    report = compile_folder(folder, opts, progress)
    hung = {o.stage_id for o in report.failed if o.failures and o.failures[-1].kind == "timeout"}
    if not hung:
        return report, []
    others = {o.stage_id for o in report.failed} - hung
    if opts.stages or not opts.cache:  # the plan would change under a --stage list, and rebuild whole
        progress(f"{', '.join(sorted(hung))} did not return with any workaround; reducing it partitions the plan "
                 "again, which --stage and --no-cache rule out: compile without them to reduce it")
        return report, []
    progress(f"{len(hung)} stage(s) did not return with any workaround ({', '.join(sorted(hung))}): reducing each to "
             "the ops that hang its build alone, as --repartition does; they move to the host")
    moved = isolate.failing_ops(report, folder, opts, isolate.Isolated(), progress, skip=others)
    if not moved:
        progress("no smaller graph hangs the build (the machine's, not the graph's: a larger --timeout, or fewer "
                 f"parallel builds, may build it): {', '.join(sorted(hung))} stays failed")
        return report, []
    cap = report.plan.extra.get("capability") or {}
    forced = {str(h["op"]): str(h["why"]) for h in cap.get("host_ops") or () if h.get("op")}
    cuts = {str(c["before"]): str(c["why"]) for c in cap.get("cuts") or () if c.get("before")}
    before, failed = sum(len(o.cpu_ops) for o in report.outcomes), len(report.failed)
    try:
        _write_again(report.plan, folder, opts, {**forced, **moved}, cuts, progress)
    except UserError as e:  # the plan's model is gone or changed: the stage stays as it failed
        progress(f"the ops that hang {', '.join(sorted(hung))} were found but the plan cannot be partitioned again "
                 f"({e})")
        return report, []
    report = compile_folder(folder, opts, progress)
    return report, [RepartitionRound(1, tuple(sorted(moved)), before, sum(len(o.cpu_ops) for o in report.outcomes),
                                     len(report.built), (), failed, len(report.failed))]


def _write_again(plan: Plan, folder: Path, opts: CompileOptions, forced: Mapping[str, str],
                 cuts: Mapping[str, str], progress: Progress) -> None:
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
                             toolkit=opts.toolkit.version if isinstance(opts.toolkit, Toolkit) else opts.toolkit,
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
    plan.check_specialised(read_npz(path, what="--inputs file"))  # a changed file would change a shape
    return path


def graph_io_of(model: Path) -> dict[str, bool]:
    """Model input -> whether its shape has a symbolic dimension (what ``--shape`` had to fix)."""
    return {t: any(d <= 0 for d in vt[1]) for t, vt in graph_io(model).inputs.items()}  # symbolic reads as 0


__all__ = ["MAX_REPARTITION_ROUNDS", "RepartitionRound", "compile_reducing_hangs", "compile_repartition", "crash_cuts",
           "graph_io_of"]
