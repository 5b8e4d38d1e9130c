"""Execute a plan stage by stage (sessions kept as its residency says) and compare it with the whole model."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rkpart.errors import InvalidModelError, SpecError, UserError
from rkpart.io import confined_file, external_locations, hash_file, regular_file
from rkpart.ir.tensors import random_feeds
from rkpart.plan.plan import Plan, Stage, TensorInfo, stage_order_ok
from rkpart.readers import read_npz
from rkpart.runtime.base import Backend, Feeds, StageRunner
from rkpart.runtime.ort import OrtBackend, make_session
from rkpart.types import HOST, NPU, RESIDENCIES, JsonObject, Residency
from rkpart.validation.metrics import Metrics, compare


def random_inputs(infos: Mapping[str, TensorInfo], names: tuple[str, ...], seed: int = 0) -> Feeds:
    """Seeded inputs for a plan's ``names`` (see :func:`random_feeds`)."""
    return random_feeds(((n, infos[n].dtype, infos[n].shape) for n in names), seed)


def load_inputs(path: str | Path, plan: Plan) -> Feeds:
    """Read model inputs from an ``.npz``; :class:`UserError` (one line) for anything unusable.

    Arrays are cast to the model's dtype only when that is value-preserving in kind
    (numbers to numbers); shapes must match exactly.  Pickled (object) arrays are refused.
    """
    p = Path(path)
    # only the model's inputs are decoded, each header checked first (rkpart.readers.read_npz)
    feeds = read_npz(p, what="inputs file", names=plan.inputs)
    for n in plan.inputs:
        if n not in feeds:
            raise UserError(f"inputs file {p} has no array {n!r} (model inputs: {', '.join(plan.inputs)})")
        info = plan.tensors[n]
        a = feeds[n]
        if not isinstance(a, np.ndarray):  # NpzFile returns raw bytes for members that are not .npy
            raise UserError(f"inputs file {p}: member {n!r} is not a .npy array")
        if tuple(a.shape) != info.shape:
            raise UserError(f"input {n!r}: shape {tuple(a.shape)} in {p}, model wants {info.shape}")
        want = np.dtype(info.dtype)
        if a.dtype.kind not in "biuf" or want.kind not in "biuf":
            raise UserError(f"input {n!r}: dtype {a.dtype} in {p} cannot be used as {want}")
        feeds[n] = a.astype(want, copy=False)
    return feeds


ResidencyChoice = Residency | str | Mapping[str, Residency | str] | None


def plan_residency(plan: Plan, default: Residency | str = Residency.RESIDENT) -> dict[str, Residency]:
    """The residency of every NPU stage as the plan chose it, ``default`` where it chose nothing.

    The ``auto`` strategy records a residency per block (``strategy.options.choices``); a
    stage takes the choice of the blocks it covers (``per-stage`` if any of them chose it,
    since that is the one that bounds memory).  Host stages are always resident.
    """
    dflt = Residency(default)
    by_block: dict[int, Residency] = {}
    for c in (plan.strategy.get("options") or {}).get("choices") or ():
        if not isinstance(c, Mapping) or c.get("residency") not in RESIDENCIES:
            continue
        for b in c.get("blocks") or ():
            by_block[int(b)] = Residency(c["residency"])
    out: dict[str, Residency] = {}
    for s in plan.stages:
        if s.device == HOST:
            out[s.id] = Residency.RESIDENT
            continue
        chosen = {by_block[b] for b in (s.blocks or (() if s.block is None else (s.block,))) if b in by_block}
        out[s.id] = (Residency.PER_STAGE if Residency.PER_STAGE in chosen else Residency.RESIDENT) if chosen else dflt
    return out


def _residency_map(plan: Plan, residency: ResidencyChoice) -> dict[str, Residency]:
    if residency is None or residency == "plan":
        return plan_residency(plan)
    if isinstance(residency, (Residency, str)):
        r = Residency(residency)
        return {s.id: Residency.RESIDENT if s.device == HOST else r for s in plan.stages}
    m = plan_residency(plan)
    m.update({k: Residency(v) for k, v in residency.items()})
    return m


@dataclass(frozen=True)
class _Unit:
    """What one runner executes: one stage, or a run of consecutive host stages as one session."""

    stage: Stage  # the stage itself, or the fused stage of ``members``
    members: tuple[Stage, ...]
    on_host: bool
    residency: Residency


class PlanExecutor:
    """Runs a plan pass after pass, keeping stage sessions as its residency policy says.

    One executor is one plan execution (a pipeline run of any number of steps and passes):

    * ``resident`` stages are loaded and initialised at their first use and kept until
      :meth:`close`, so every later pass only infers;
    * ``per-stage`` stages are loaded, initialised, run and released in every pass (what
      the write-up did to stay inside the NPU's memory; what the profiler measures);
    * host stages are host code in the pipeline: always resident; with ``fuse_host`` a run
      of consecutive host stages is one ORT session (when the host backend supports it).

    NPU stages run on ``backend`` (if it executes NPU stages), everything else on ``host``.

    Parameters
    ----------
    plan, folder
        The plan and the folder its stage files are relative to.
    backend, host
        Executors of NPU stages and of host stages (default: ONNX Runtime for both).
    residency
        ``"resident"``, ``"per-stage"``, a mapping ``stage id -> residency``, or ``None`` /
        ``"plan"`` for the plan's own choice (:func:`plan_residency`).
    fuse_host
        Run consecutive host stages as one session.
    stages
        Only these stages (in plan order), e.g. one block's; their inputs must be fed.

    Examples
    --------
    >>> with PlanExecutor(plan, folder, residency="resident") as ex:  # doctest: +SKIP
    ...     for step in range(steps):
    ...         out = ex.run(feeds)
    """

    def __init__(
        self,
        plan: Plan,
        folder: str | os.PathLike[str],
        *,
        backend: Backend | None = None,
        host: Backend | None = None,
        residency: ResidencyChoice = None,
        fuse_host: bool = True,
        stages: Sequence[Stage] | None = None,
    ) -> None:
        self.plan = plan
        self.folder = Path(folder)
        self.backend = backend or OrtBackend()
        self.host = host or OrtBackend()
        chosen = tuple(stages) if stages is not None else plan.stages
        self._index = {s.id: i for i, s in enumerate(plan.stages)}
        unknown = [s.id for s in chosen if s.id not in self._index]
        if unknown:
            raise SpecError(f"stage {unknown[0]!r} is not in the plan")
        if stages is None:
            problem = stage_order_ok(plan.stages, plan.inputs)
            if problem:
                raise SpecError(f"plan cannot run in order: {problem}")
        self.residency = _residency_map(plan, residency)
        self.units = self._make_units(chosen, fuse_host)
        self._drop = self._last_uses()
        self._live: dict[str, StageRunner] = {}

    def _last_uses(self) -> tuple[tuple[str, ...], ...]:
        """Per unit, the tensors no later unit reads (model outputs excepted): a pass drops them
        once that unit has run, so it holds only live tensors.  Without this a full-size pass
        kept every intermediate of all 169 stages (about 10 GB per pass at 1024 tokens)."""
        last: dict[str, int] = {}
        for k, u in enumerate(self.units):
            for m in u.members:
                for t in (*m.inputs, *m.outputs):
                    last[t] = k
        outputs = set(self.plan.outputs)
        drop: list[list[str]] = [[] for _ in self.units]
        for t, k in last.items():
            if t not in outputs:
                drop[k].append(t)
        return tuple(tuple(sorted(d)) for d in drop)

    def _on_host(self, stage: Stage) -> bool:
        return not (stage.device == NPU and NPU in self.backend.devices)

    def _make_units(self, stages: Sequence[Stage], fuse: bool) -> tuple[_Unit, ...]:
        units: list[_Unit] = []
        run: list[Stage] = []

        def flush() -> None:
            if len(run) > 1 and fuse and self.host.fused_runner(run, self.folder) is not None:
                from rkpart.runtime.ort import fused_stage

                units.append(_Unit(fused_stage(run), tuple(run), True, Residency.RESIDENT))
            else:
                units.extend(_Unit(s, (s,), True, Residency.RESIDENT) for s in run)
            run.clear()

        for s in stages:
            if s.device == HOST:
                run.append(s)
                continue
            flush()
            units.append(_Unit(s, (s,), self._on_host(s), self.residency.get(s.id, Residency.RESIDENT)))
        flush()
        return tuple(units)

    def _runner(self, u: _Unit) -> StageRunner:
        b = self.host if u.on_host else self.backend
        r = b.fused_runner(u.members, self.folder) if len(u.members) > 1 else b.runner(u.stage, self.folder)
        assert r is not None
        return r.expect(self.plan.tensors).__enter__()

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        *,
        keep: bool = False,
        on_stage: Callable[[int, str, Feeds], None] | None = None,
    ) -> Feeds:
        """One pass: every stage in order.  Returns the model outputs (every tensor with ``keep``).

        Arrays are passed from stage to stage as they are (no copies, no dtype conversion).
        ``on_stage(index in plan.stages, stage id, outputs)`` is called after each stage.
        """
        cb = None if on_stage is None else (lambda _p, i, sid, out: on_stage(i, sid, out))
        return self.run_passes([feeds], keep=keep, on_stage=cb)[0]

    def run_passes(
        self,
        feeds: Sequence[Mapping[str, np.ndarray]],
        *,
        keep: bool = False,
        on_stage: Callable[[int, int, str, Feeds], None] | None = None,
    ) -> list[Feeds]:
        """Independent passes (e.g. CFG's conditional and unconditional one) run stage-major:
        each stage serves every pass back to back before the next stage, so a ``per-stage``
        stage (or one a backend must rebuild) is loaded once for all of them.  Results equal
        :meth:`run` on each; ``on_stage(pass, index, stage id, outputs)``.
        """
        for f in feeds:  # inputs that could change a shape the plan was specialised to: refused up front
            self.plan.check_specialised(f)
        envs: list[dict[str, np.ndarray]] = [dict(f) for f in feeds]
        live = self._live
        for k, u in enumerate(self.units):
            r = live.get(u.stage.id)
            if r is not None:  # the common case of a resident plan: just infer
                for env in envs:
                    r.infer_into(env)
            elif u.residency is Residency.PER_STAGE:
                r = self._runner(u)
                try:
                    outs = [r.infer(env) for env in envs]
                finally:
                    r.release()
                for env, out in zip(envs, outs, strict=True):
                    for m in u.members:
                        check_stage_outputs(self.plan, m, out)
                    env.update(out)
            else:
                r = live[u.stage.id] = self._runner(u)
                for env in envs:
                    r.infer_into(env)
                    # checked on a resident session's first run: later runs give the same shapes
                    for m in u.members:
                        check_stage_outputs(self.plan, m, env)
            if on_stage is not None:
                for p, env in enumerate(envs):
                    for m in u.members:
                        on_stage(p, self._index[m.id], m.id, {n: env[n] for n in m.outputs})
            if not keep:
                for env in envs:
                    for t in self._drop[k]:
                        env.pop(t, None)
        if keep:
            return envs
        missing = [o for o in self.plan.outputs if envs and o not in envs[0]]
        if missing:
            raise SpecError(f"plan never produces model output {missing[0]!r}")
        return [{o: env[o] for o in self.plan.outputs} for env in envs]

    @property
    def live(self) -> tuple[str, ...]:
        """Ids of the units whose sessions are held now."""
        return tuple(self._live)

    def close(self) -> None:
        """Release every held session (idempotent)."""
        held = list(self._live.values())
        self._live.clear()
        for r in held:
            r.release()

    def __enter__(self) -> PlanExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_plan(
    plan: Plan,
    folder: str | os.PathLike[str],
    feeds: Feeds,
    *,
    backend: Backend | None = None,
    host: Backend | None = None,
    keep: bool = False,
    on_stage: Callable[[int, str, Feeds], None] | None = None,
    residency: ResidencyChoice = Residency.PER_STAGE,
) -> Feeds:
    """Run every stage once in order; NPU stages on ``backend``, host stages on ``host`` (ORT).

    One pass of a :class:`PlanExecutor`: with one pass every stage session is created once
    either way; ``per-stage`` (the default) releases each after use, so at most one NPU
    stage is held at a time.  Returns the model outputs (every tensor with ``keep``).
    """
    with PlanExecutor(plan, folder, backend=backend, host=host, residency=residency) as ex:
        return ex.run(feeds, keep=keep, on_stage=on_stage)


def find_model(plan: Plan, folder: Path, model: str | Path | None = None) -> Path:
    """The whole model a plan was cut from: ``model``, the recorded path, or next to the folder.

    ``model`` (``--model``) may be anywhere but must be a regular file.  Without it, the plan's
    recorded ``model.path`` and ``<plan folder>/../<model.file>`` are candidates, used only
    if the file there is a regular file whose sha256 equals the plan's ``model.sha256``: a
    plan cannot make ``run`` or ``profile`` read an arbitrary file.  Either way the model's
    external data must stay in its folder and be regular files (as for ``partition``).
    """
    if model is not None:
        p = Path(model)
        regular_file(p, what="whole model")
    else:
        p = _recorded_model(plan, folder)
    for loc in external_locations(p, what="whole model", error=InvalidModelError):
        confined_file(p.parent, loc, what=f"whole model {p.name} external data", error=InvalidModelError)
    return p


def _recorded_model(plan: Plan, folder: Path) -> Path:
    import hashlib
    import os
    import stat

    cands = [Path(str(plan.model["path"]))] if plan.model.get("path") else []
    cands.append(folder.parent / Path(str(plan.model.get("file", ""))).name)
    for cand in cands:
        try:
            if not stat.S_ISREG(os.stat(cand).st_mode):
                continue
            h = hashlib.sha256()
            hash_file(h, cand)
        except OSError:
            continue
        if h.hexdigest() == plan.model.get("sha256"):
            return cand
    raise UserError(f"cannot find the whole model {plan.model.get('file')!r} to compare with (no file at "
                    f"{', '.join(map(str, cands))} has the plan's sha256); pass --model")


def run_model(model: str | Path, feeds: Feeds, outputs: tuple[str, ...] | None = None, *,
              load_hint: str = "") -> Feeds:
    """The whole model under ONNX Runtime: the reference every plan is checked against.

    A model ONNX Runtime refuses to load is said to be that (``load_hint`` appended: what to do instead),
    not blamed on the plan's inputs and outputs, which only a run can disagree with."""
    from rkpart.runtime.ort import ort_errors

    with ort_errors(f"ONNX Runtime cannot load the whole model {model}{load_hint}"):
        sess = make_session(str(model))
    with ort_errors(f"whole model {model} (do the plan's inputs and outputs match it?)"):
        names = list(outputs) if outputs else [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, feeds), strict=True))


def check_stage_outputs(plan: Plan, stage: Stage, out: Feeds) -> None:
    """A stage produced every output plan.json names, with its dtype and shape; otherwise the
    plan and the stage files disagree and a result would be silently wrong."""
    for t in stage.outputs:
        if t not in out:
            raise SpecError(f"stage {stage.id} did not produce {t!r}, which plan.json says it outputs")
        info = plan.tensors[t]
        a = out[t]
        if tuple(a.shape) != tuple(info.shape) or a.dtype.name != info.dtype:
            raise SpecError(f"stage {stage.id} output {t!r} is {a.dtype}{list(a.shape)}; plan.json says "
                            f"{info.dtype}{list(info.shape)}")


def compare_outputs(actual: Feeds, reference: Feeds) -> dict[str, Metrics]:
    return {k: compare(actual[k], reference[k]) for k in reference}


def metrics_table(results: Mapping[str, Metrics]) -> list[JsonObject]:
    return [{"tensor": k, **m.to_json()} for k, m in results.items()]
