"""``rkpart compile --repartition``: partition again from what the plan's own builds did.

The loop sits above the pipeline and the compiler: build the plan, move every op a build put on
the CPU to the host and cut in front of the ops a crashed build fused, write the plan again with
its strategy (:mod:`rkpart.pipeline`: load, propose, write), and build what changed; until
nothing is left to fix, or the rounds run out.

**Round 0 checks what the learned-placement store moved** (:func:`learned_moves`): when the
partition moved ops for a learned placement, the plan is written again without the learned
placements and built, so each such op is built in the stage it lands in; a pattern whose op runs
on the NPU there is dropped from the store (:func:`rkpart.grouping.learned.contradict`), and the
ops that run on the CPU are CPU layers of this plan, which the rounds move by name (the rounds
after a check partition without the store: what it taught was just checked here).

**A round is kept only when it pays** (:func:`judge_round`).  A round that leaves more failed
stages, or, with no failed stage to fix, does not reduce the CPU layers, or costs more than it
saves, is undone at once: the plan before it is written again (its stages taken from the build
cache) and the loop stops, since the next round would make the same moves.  What a round costs
and saves is weighed per pass of the plan (:class:`PlanFigures`): the matmul work it took off the
NPU, run on the host instead, the stage calls and boundary bytes it added, against the CPU layers
it removed (each one call and a round trip of the bytes its op reads and writes).  Measured on a
head-dim-88 family (issue 50): rounds 3-4 moved every Softmax and attention-value product to the
host without removing a CPU layer and were kept (14 NPU stages instead of 6, 94.4 % of the block
matmul work on the NPU, 4 CPU layers still left).  Rounds that work on failed stages are judged
by failures first; the best such round's plan is kept at the end.
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
    #: why this round was undone (:func:`judge_round`), ``""`` when it was kept
    undone: str = ""
    #: round 0: the ops learned placements had moved to the host, put back and built to check them
    checked: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.checked:
            return (f"repartition check: {len(self.checked)} op(s) learned placements had moved to the host put "
                    f"back and built; CPU layers in NPU stages {self.cpu_layers_before} -> {self.cpu_layers_after} "
                    f"(a pattern whose op ran on the NPU is dropped from the store); {self.stages_built} stage(s) "
                    "built")
        if self.kept_best:
            return (f"repartition round {self.round}: the rounds before made it worse; the best round's plan "
                    f"written again: CPU layers in NPU stages {self.cpu_layers_before} -> {self.cpu_layers_after}, "
                    f"failed stages {self.failed_before} -> {self.failed_after}; {self.stages_built} stage(s) rebuilt")
        cut = f"; {len(self.cut_before)} cut(s) in front of ops a crashed build fused" if self.cut_before else ""
        failed = (f", failed stages {self.failed_before} -> {self.failed_after}"
                  if self.cut_before or self.failed_before else "")
        undone = f"; undone: {self.undone}" if self.undone else ""
        return (f"repartition round {self.round}: {len(self.moved)} op(s) the build put on the CPU (or that fail it) "
                f"moved to the host; CPU layers in NPU stages {self.cpu_layers_before} -> {self.cpu_layers_after}"
                f"{cut}{failed}; {self.stages_built} stage(s) rebuilt{undone}")


#: seconds per MAC on the NPU: the board's fitted inference coefficient (docs/cost-model.md, 64 GMAC/s)
NPU_S_PER_MAC = 15.6e-12
#: seconds per MAC of matmul work on the board's host: 4x the NPU's (an A76 core under ONNX Runtime in
#: float32; an assumption, not fitted: the rule needs the order of magnitude, not the figure)
HOST_S_PER_MAC = 4 * NPU_S_PER_MAC
#: seconds per stage call and pass (docs/cost-model.md, glue per stage: ~0.4 ms); a CPU layer inside an
#: NPU stage is one such handover too
S_PER_CALL = 0.4e-3
#: seconds per byte handed between NPU and host (with the toolkit's layout conversion; ~1 GB/s, an assumption)
S_PER_BYTE = 1e-9


@dataclass(frozen=True)
class PlanFigures:
    """What a built plan costs per pass, as :func:`judge_round` weighs it."""

    failed: int  # NPU stages whose build failed
    cpu_layers: int  # CPU layers inside NPU stages
    cpu_layer_bytes: int  # bytes their ops read and write (traced ones)
    npu_macs: int  # the blocks' matmul work in NPU stages (plan extra.npu_coverage)
    block_macs: int
    npu_stages: int
    npu_io_bytes: int  # bytes every NPU stage reads and writes (each crosses the host boundary)

    def seconds(self) -> float:
        """Predicted seconds per pass of what differs between two plans of one model: the matmul work
        on each side, the NPU stage calls and their handovers, the CPU layers' round trips."""
        return (self.npu_macs * NPU_S_PER_MAC + (self.block_macs - self.npu_macs) * HOST_S_PER_MAC
                + (self.npu_stages + self.cpu_layers) * S_PER_CALL
                + (self.npu_io_bytes + 2 * self.cpu_layer_bytes) * S_PER_BYTE)

    @classmethod
    def of(cls, report: CompileReport, layers: list[CpuLayer]) -> PlanFigures:
        plan = report.plan
        cov = plan.extra.get("npu_coverage") or {}
        npu = [s for s in plan.stages if s.device == "npu"]
        return cls(failed=len(report.failed), cpu_layers=sum(len(o.cpu_ops) for o in report.outcomes),
                   cpu_layer_bytes=sum(x.nbytes for x in {(x.stage, x.layer): x for x in layers}.values()),
                   npu_macs=int(cov.get("npu_macs") or 0), block_macs=int(cov.get("block_macs") or 0),
                   npu_stages=len(npu), npu_io_bytes=sum(s.io_bytes for s in npu))


def learned_moves(plan: Plan) -> tuple[str, ...]:
    """The ops of ``plan`` the partition moved to the host for a learned placement (by name)."""
    rec = plan.extra.get("capability") or {}
    rows = rec.get("host_ops") if isinstance(rec, dict) else None
    return tuple(sorted({str(h.get("op")) for h in rows or () if isinstance(h, dict)
                         and "(learned placement)" in str(h.get("why", ""))}))


def judge_round(before: PlanFigures, after: PlanFigures) -> str | None:
    """Why a ``--repartition`` round that took the plan from ``before`` to ``after`` is undone (``None``: kept).

    Failed stages first: a round that fixes one is kept, one that adds one is undone.  A round with
    failed stages left to work on is kept (several rounds of cuts may be needed; the best of them is
    kept at the end).  Otherwise a round must reduce the CPU layers, and what its moves add per pass
    (matmul work on the host, stage calls, handovers) must not exceed what the layers it removed cost.
    """
    if after.failed > before.failed:
        return f"failed stages {before.failed} -> {after.failed}"
    if after.failed < before.failed or before.failed:
        return None
    if after.cpu_layers >= before.cpu_layers:
        return (f"it did not reduce the CPU layers ({before.cpu_layers} -> {after.cpu_layers}; NPU stages "
                f"{before.npu_stages} -> {after.npu_stages})")
    t0, t1 = before.seconds(), after.seconds()
    if t1 > t0:
        share = (f", {before.npu_macs / before.block_macs:.1%} -> {after.npu_macs / after.block_macs:.1%} of the "
                 "block matmul work on the NPU" if before.block_macs and after.block_macs else "")
        return (f"it costs more than it saves: CPU layers {before.cpu_layers} -> {after.cpu_layers}, NPU stages "
                f"{before.npu_stages} -> {after.npu_stages}{share}; ~{t0 * 1e3:.2f} -> ~{t1 * 1e3:.2f} ms per pass")
    return None


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
    moved = learned_moves(report.plan)
    use_learned = True  # after the check, the rounds move this plan's ops by name alone (its builds checked them)
    if moved and opts.learn:
        # check the store's moves against a build of the stages they land in: the plan without the learned
        # placements, built (only the stages that change); learn_placements drops every pattern whose op ran
        # on the NPU there, and the ops that ran on the CPU are this plan's CPU layers, moved by the rounds
        progress(f"repartition: checking the {len(moved)} op(s) learned placements moved to the host: the plan "
                 "without them, built")
        before = sum(len(o.cpu_ops) for o in report.outcomes)
        use_learned = False
        _write_again(report.plan, folder, opts, forced, cuts, progress, learned=use_learned)
        report, layers = build()
        rounds.append(RepartitionRound(0, (), before, sum(len(o.cpu_ops) for o in report.outcomes),
                                       len(report.built), failed_before=len(report.failed),
                                       failed_after=len(report.failed), checked=moved))

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
        prior = (dict(forced), dict(cuts))
        figures = PlanFigures.of(report, layers)
        forced.update(new)
        cuts.update(new_cuts)
        progress(f"repartition round {r}: moving {len(new)} op(s) the build put on the CPU (or that fail it) to the "
                 f"host, cutting in front of {len(new_cuts)} op(s) a failed build fused")
        _write_again(report.plan, folder, opts, forced, cuts, progress, learned=use_learned)
        report, layers = build()
        after = sum(len(o.cpu_ops) for o in report.outcomes)
        why = judge_round(figures, PlanFigures.of(report, layers))
        rounds.append(RepartitionRound(r, tuple(sorted(new)), before, after, len(report.built),
                                       tuple(sorted(new_cuts)), failed, len(report.failed), undone=why or ""))
        if why is not None:
            # undone at once: the plan before the round is written again, its stages taken from the build cache;
            # the next round would make the same moves, so the loop stops
            progress(f"repartition round {r} undone: {why}")
            forced, cuts = prior
            _write_again(report.plan, folder, opts, forced, cuts, progress, learned=use_learned)
            report, layers = build()
            rounds.append(RepartitionRound(rounds[-1].round + 1, (), after,
                                           sum(len(o.cpu_ops) for o in report.outcomes), len(report.built), (),
                                           rounds[-1].failed_after, len(report.failed), kept_best=True))
            best = (badness(report), dict(forced), dict(cuts))
            break
        if badness(report) < best[0]:
            best = (badness(report), dict(forced), dict(cuts))
    if badness(report) > best[0]:
        # rounds on failed stages may end worse than they started: the best one's plan is written again
        progress(f"repartition: keeping the plan of the best round ({best[0][1]} CPU layer(s), {best[0][0]} "
                 f"failed stage(s)); the last round left {badness(report)[1]} and {badness(report)[0]}")
        _write_again(report.plan, folder, opts, best[1], best[2], progress, learned=use_learned)
        report, layers = build()
        rounds.append(RepartitionRound(rounds[-1].round + 1, (), rounds[-1].cpu_layers_after,
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
                 cuts: Mapping[str, str], progress: Progress, learned: bool = True) -> None:
    """Partition the plan's model again into ``folder`` with its strategy, ``forced`` ops on the host
    (``learned=False``: without the learned placements)."""
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
                             weights="link" if "weights" in plan.extra else "copy", learned=learned)
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


__all__ = ["MAX_REPARTITION_ROUNDS", "PlanFigures", "RepartitionRound", "compile_reducing_hangs",
           "compile_repartition", "crash_cuts", "graph_io_of", "judge_round", "learned_moves"]
