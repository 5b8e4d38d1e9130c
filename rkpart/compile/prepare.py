"""Prepare a stage for one toolkit: lower its opset and apply NPU rewrites, proven under ORT.

The plan's stage file is never changed.  When the stage's opset is above what the toolkit
loads (:attr:`rkpart.targets.base.ToolkitCaps.max_opset`), or a ``npu`` row of
:data:`rkpart.targets.rewrites.REWRITES` matches, a prepared copy is written to
``rknn/prepared/<stage sha256[:16]>.<toolkit>.onnx`` and built instead.  It is kept only if
ONNX Runtime gives the same outputs for it and for the original on seeded random inputs:

* opset lowering: the ``rkpart run`` ORT gate (cosine >= 0.999999, max abs <= 1e-5 x max|ref|);
* NPU rewrites (exact in real arithmetic): cosine >= 0.999999 and max abs within
  :func:`exact_gate`: the outputs' own scale (max |reference|) times a float rounding budget,
  ``EXACT_ULPS_PER_OP`` x the output dtype's epsilon x the ops on the stage's longest path (at
  least 1e-6).  A fixed 1e-6 relative check sat on the rounding noise of a deep stage: measured
  (issue 50), ``layernorm-scale-fold`` was dropped in one cross-attention stage at max abs 2.83e-7
  and kept in its identical twin; on a 12-op cross-attention of 8 x 72 heads the fold moves the
  output by 0.5-1.25e-6 of its scale depending on the block's weights, so twin blocks got
  different verdicts.  The budget there is 1.1e-5: ten times the noise, and a rewrite that is
  wrong by 1e-4 of the scale still fails;
* an approximate rewrite (a row with a ``gate``: bfloat16-widen) is applied and checked alone
  first, against the original at its own gate; the exact rewrites are then checked against the
  outputs of the stage it made.

A lowering that cannot be done or does not pass becomes the stage's build failure (the
toolkit would refuse the original anyway).  An NPU rewrite that does not pass is dropped, only
that one: when the rewrites together fail the check, each is applied and checked in turn and
the failing ones are left out.  Each dropped rewrite is recorded with why
(``dropped_rewrites``: name -> reason), as are the rewrites compile drops because the
toolkit's build failed with them (``drop``: :mod:`rkpart.compile.compile` retries such a stage
without them).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from rkpart.errors import ToolkitError, UserError
from rkpart.ir.tensors import random_feeds
from rkpart.plan.extract import stage_sha256
from rkpart.readers import FileKind
from rkpart.targets import get_target
from rkpart.targets.opset import lower_model, model_opset
from rkpart.targets.rewrites import DEDUPE, REWRITES, Rewrite, apply_rewrites, compile_rewrites_for
from rkpart.targets.rewrites.precision import emulated_copy
from rkpart.types import JsonMap, JsonObject
from rkpart.validation.metrics import Gate, compare

PREPARED_DIR = "prepared"
#: bump when the record's format changes (a change of the rewrites' or lowering's code is seen by
#: :func:`prepare_code_key` and makes prepared copies again by itself)
# 2: the record carries the prepared sha256; 3: scatternd-interleave writes intermediates; 4: nan-guard 2.3.x
# 5: rewrites failing the gate dropped one by one, dropped_rewrites recorded; nan-guard on every toolkit
# 6: strided-slices-concat reads negative / past-the-end Slice bounds and joins adjacent pieces
# 7: adaln-chunk-gemm sees through unit-axis reshapes between the Gemm and its chunks (PRX)
# 8: rope-halves (2.3.x); 9: the check draws inputs whose reference is finite (or asks for NaN in the same places)
# 10: bfloat16-widen, approximate rows checked first at their own gate; 11: exact rows at exact_gate
PREPARE_VERSION = 11
#: the record of a prepared copy (``rknn/prepared/<sha>.<toolkit>.json``); unreadable: prepared again
PREPARED_KIND = FileKind("prepared-copy record", "json", 4 << 20, UserError, symlinks=False,
                         doc="a plan's `rknn/prepared/*.json`, read by `compile` (unreadable: prepared again)")
LOWER_GATE = Gate(min_cosine=0.999999, max_abs_rel=1e-5)
#: the least an exact rewrite's check allows (relative to max |reference|), and its cosine
REWRITE_GATE = Gate(min_cosine=0.999999, max_abs_rel=1e-6)
#: epsilons of an output's dtype an exact rewrite may move it by, per op on the stage's longest path: each op
#: rounds, and a rewrite exact in real arithmetic changes where (a 12-op cross-attention: 0.5-1.25e-6 of the
#: output's scale measured, 4-10 epsilons; the budget, 96 epsilons, leaves an order of magnitude over it)
EXACT_ULPS_PER_OP = 8
#: ops counted at most: the budget of a very deep stage stays well under a real error (8 x eps x 64: 6e-5 in fp32)
EXACT_MAX_DEPTH = 64


def stage_depth(model: onnx.ModelProto) -> int:
    """The ops on the longest path through ``model``'s graph (nodes in topological order, as ONNX keeps them)."""
    depth: dict[str, int] = {}
    best = 0
    for n in model.graph.node:
        d = 1 + max((depth.get(t, 0) for t in n.input if t), default=0)
        for t in n.output:
            depth[t] = d
        best = max(best, d)
    return best


def exact_gate(depth: int, dtype: np.dtype) -> Gate:
    """The check of an exact rewrite's output of ``dtype`` in a stage ``depth`` ops deep: max abs at most
    ``EXACT_ULPS_PER_OP x eps(dtype) x depth`` times the output's max |reference| (at least
    :data:`REWRITE_GATE`'s 1e-6), cosine at least 0.999999.  Twin stages (the same ops, other weights or
    another data scale) get the same budget relative to their own scale, so the same verdict."""
    eps = float(np.finfo(dtype).eps) if np.dtype(dtype).kind == "f" else 0.0
    rel = max(REWRITE_GATE.max_abs_rel or 0.0, EXACT_ULPS_PER_OP * eps * min(max(depth, 1), EXACT_MAX_DEPTH))
    return Gate(min_cosine=REWRITE_GATE.min_cosine, max_abs_rel=rel)


@dataclass(frozen=True)
class PreparedRecord:
    """What was done to a stage before its build: the stage's ``prepared`` entry in plan.json
    (:meth:`to_json`, the schema's ``prepared``) and the prepared copy's cache metadata."""

    toolkit: str
    from_opset: int
    to_opset: int
    rewrites: Mapping[str, int]  # rewrite name -> how many ops it rewrote
    file: str  # the file built, relative to the plan folder
    sha256: str
    dropped_rewrites: Mapping[str, str] = field(default_factory=dict)  # rewrite name -> why it was left out
    #: the verdict on the rewrites weighed for memory (:meth:`rkpart.compile.weigh.Verdict.to_json`): set by
    #: compile, never by prepare_stage
    weighed: JsonMap | None = None

    def to_json(self) -> JsonObject:
        # sorted: a record read back from the prepare cache (sort_keys) and a fresh one (table order) say the
        # same, so a rerun from the caches writes the same plan.json
        return {"toolkit": self.toolkit, "from_opset": self.from_opset, "to_opset": self.to_opset,
                "rewrites": dict(sorted(self.rewrites.items())),
                **({"dropped_rewrites": dict(sorted(self.dropped_rewrites.items()))} if self.dropped_rewrites else {}),
                **({"weighed": dict(self.weighed)} if self.weighed is not None else {}),
                "file": self.file, "sha256": self.sha256}

    @classmethod
    def from_json(cls, d: JsonMap) -> PreparedRecord:
        # ``weighed`` is compile's, never read back from a prepared copy's record
        return cls(toolkit=str(d["toolkit"]), from_opset=int(d["from_opset"]), to_opset=int(d["to_opset"]),
                   rewrites=dict(d["rewrites"]), file=str(d["file"]), sha256=str(d["sha256"]),
                   dropped_rewrites=dict(d.get("dropped_rewrites", {})))

    def describe(self) -> str:
        """``lowered from opset 20 to 19 for rknn-toolkit2 2.3.0, gelu20-decompose x1`` (progress lines)."""
        parts = []
        if self.from_opset != self.to_opset:
            parts.append(f"lowered from opset {self.from_opset} to {self.to_opset} for rknn-toolkit2 {self.toolkit}")
        parts += [f"{k} x{v}" for k, v in sorted(self.rewrites.items())]
        return ", ".join(parts)


@dataclass(frozen=True)
class Prepared:
    """The file to build for one stage and what was done to make it."""

    onnx: Path
    record: PreparedRecord | None  # None: the stage file itself is built


def prepare_stage(onnx_path: Path, stage_sha: str, rknn_dir: Path, toolkit: str, target: str,
                  seed: int = 0, rewrites: bool = True, drop: Mapping[str, str] | None = None,
                  skip: frozenset[str] = frozenset()) -> Prepared:
    """The file ``toolkit`` should build for the stage at ``onnx_path`` (see the module doc).

    ``rewrites=False`` applies no ``npu`` rewrite (opset lowering still happens).  ``drop``
    leaves out the ``npu`` rewrites it names and records them as dropped with its reason (the
    record then exists even when nothing else changed: its file is the stage file itself).
    ``skip``: ``npu`` rewrites the user left out (``--skip-rewrite``): not applied, not recorded.

    Raises
    ------
    ToolkitError
        The stage needs lowering and it cannot be done, or the lowered stage differs under ORT.
    """
    caps = get_target(target).caps(toolkit)
    head = onnx.load(str(onnx_path), load_external_data=False)
    opset = model_opset(head)
    needs_lowering = opset > caps.max_opset
    drop = dict(drop or {})
    npu_rows = tuple(r for r in compile_rewrites_for(toolkit)
                     if r.name not in drop and r.name not in skip) if rewrites else ()
    ops = {n.op_type for n in head.graph.node}
    if not needs_lowering and not drop and not any(r.may_match(head, ops) for r in npu_rows):
        return Prepared(onnx_path, None)
    out_dir = rknn_dir / PREPARED_DIR
    tag = "" if rewrites else ".norewrite"
    if drop and rewrites:
        tag = ".without-" + hashlib.sha256("\n".join(sorted(drop)).encode()).hexdigest()[:8]
    if skip and rewrites:
        tag += ".skip-" + hashlib.sha256("\n".join(sorted(skip)).encode()).hexdigest()[:8]
    dest = out_dir / f"{stage_sha[:16]}.{toolkit}{tag}.onnx"
    meta_path = dest.with_suffix(".json")
    if meta_path.is_file():
        try:
            meta = PREPARED_KIND.load(meta_path, root=rknn_dir)
            if meta.get("version") == PREPARE_VERSION and meta.get("stage_sha256") == stage_sha \
                    and meta.get("rules") == _rules() and meta.get("drop", {}) == drop:
                if not meta["record"]:
                    return Prepared(onnx_path, None)
                rec = PreparedRecord.from_json(meta["record"])
                built = rknn_dir.parent / rec.file
                if built.is_file() and rec.sha256 == stage_sha256(built):  # an edited copy is made again
                    return Prepared(built, rec)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, UserError):
            pass  # an unreadable record is made again
    model = onnx.load(str(onnx_path))
    record: JsonObject = {"toolkit": toolkit, "from_opset": opset, "to_opset": opset, "rewrites": {}}
    current = model
    # ONNX Runtime has no CPU kernel for most bfloat16 ops: the reference of a stage holding them is
    # computed as bfloat16 would be, op by op in float32 rounded to bfloat16 (emulate_bfloat16)
    feeds, ref = _finite_reference(emulated_copy(model) or model, seed)
    if needs_lowering:
        lowered, low = lower_model(model, caps.max_opset, toolkit)
        _check(ref, _run(emulated_copy(lowered) or lowered, feeds), LOWER_GATE,
               f"the stage lowered from opset {opset} to {caps.max_opset} differs under ONNX Runtime")
        current = lowered
        record.update(to_opset=caps.max_opset, rewrites=dict(low.rewrites))
    dropped = dict(drop)
    # approximate rows (bfloat16-widen) first, each alone against the original at its own gate; the
    # exact rows are then checked against what the stage computes after them
    for r in npu_rows:
        if r.gate is None:
            continue
        current, done, failed = _apply_checked(current, (r,), ref, feeds, Gate(*r.gate))
        record["rewrites"].update(done)
        dropped.update(failed)
        if done:
            ref = _run(current, feeds)
    exact = tuple(r for r in npu_rows if r.gate is None)
    if exact:
        current, done, failed = _apply_checked(current, exact, ref, feeds)
        record["rewrites"].update(done)
        dropped.update(failed)
    if dropped:
        record["dropped_rewrites"] = dropped
    record_out: PreparedRecord | None = None
    if current is not model:
        out_dir.mkdir(parents=True, exist_ok=True)
        _save(current, dest)
        record_out = PreparedRecord.from_json({**record, "file": os.path.relpath(dest, rknn_dir.parent),
                                               "sha256": stage_sha256(dest)})
    elif dropped:  # nothing changed, but say what was left out and why: the stage file is built
        record_out = PreparedRecord.from_json({**record, "file": os.path.relpath(onnx_path, rknn_dir.parent),
                                               "sha256": stage_sha})
    tmp = meta_path.with_suffix(f".{os.getpid()}.tmp")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp.write_text(json.dumps({"version": PREPARE_VERSION, "stage_sha256": stage_sha, "rules": _rules(),
                               "drop": drop, "record": None if record_out is None else record_out.to_json()},
                              indent=2, sort_keys=True))
    os.replace(tmp, meta_path)
    if record_out is None:
        return Prepared(onnx_path, None)
    return Prepared(dest if current is not model else onnx_path, record_out)


def _apply_checked(model: onnx.ModelProto, rows: tuple[Rewrite, ...], ref: list[np.ndarray],
                   feeds: dict[str, np.ndarray], gate: Gate | None = None,
                   ) -> tuple[onnx.ModelProto, dict[str, int], dict[str, str]]:
    """``rows`` applied to a copy of ``model``, only those that keep it equal to ``ref`` under ORT
    (at ``gate``; ``None``: :func:`exact_gate` of ``model``'s depth, per output dtype).

    Returns (the model, rewrite name -> matches, dropped rewrite name -> why).  One ORT run when
    all of them pass together; otherwise each is applied and checked in turn, in table order.
    """
    cand = onnx.ModelProto()
    cand.CopyFrom(model)
    done = apply_rewrites(cand, rows)
    if not done:
        return model, {}, {}
    if gate is None:
        depth = stage_depth(model)
        gate_of: Gate | Callable[[np.ndarray], Gate] = lambda r: exact_gate(depth, r.dtype)  # noqa: E731
    else:
        gate_of = gate
    try:
        _check(ref, _run(cand, feeds), gate_of, "differs under ONNX Runtime")
        return cand, done, {}
    except ToolkitError as e:
        if len(done) == 1:
            return model, {}, {next(iter(done)): str(e)}
    current, kept, failed = model, {}, {}
    for r in rows:
        if r.name not in done:
            continue
        cand = onnx.ModelProto()
        cand.CopyFrom(current)
        one = apply_rewrites(cand, (r,))
        if not one:
            continue
        try:
            _check(ref, _run(cand, feeds), gate_of, "differs under ONNX Runtime")
        except ToolkitError as e:
            failed[r.name] = str(e)
            continue
        current = cand
        kept.update(one)
    return current, kept, failed


def prepare_identity() -> list[str]:
    """What makes the prepared copies: the prepare version and the rewrite table's rows (a verdict weighed on
    copies of another table is weighed again, :mod:`rkpart.compile.weigh`)."""
    return [f"prepare-v{PREPARE_VERSION}", *_rules()]


def _rules() -> list[str]:
    """The rewrite table's rows by name, then the fingerprint of the code that makes a prepared copy
    (:func:`prepare_code_key`): a copy made under another table, or by other rewrite code, is made again."""
    return [*(r.name for r in (*REWRITES, DEDUPE)), f"code:{prepare_code_key()}"]


#: the modules whose source decides what a prepared copy holds: the rewrites, the lowering, this module
_PREPARE_SOURCES = ("targets/rewrites", "targets/opset.py", "compile/prepare.py")


@functools.cache
def prepare_code_key(root: Path | None = None) -> str:
    """sha256 (16 hex digits) of the source of :data:`_PREPARE_SOURCES` under ``root`` (the package).

    A rewrite whose code changes under the same name (a fix, a new matched form) would otherwise be
    served its old prepared copy from the compile cache until PREPARE_VERSION was bumped by hand."""
    root = root or Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for rel in _PREPARE_SOURCES:
        p = root / rel
        for f in sorted(p.rglob("*.py")) if p.is_dir() else [p]:
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _save(model: onnx.ModelProto, dest: Path) -> None:
    size = sum(len(t.raw_data) for t in model.graph.initializer)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    data = dest.with_name(dest.name + ".data")
    if size > (1 << 30):
        onnx.save(model, str(tmp), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=data.name, size_threshold=1024)
    else:
        data.unlink(missing_ok=True)
        onnx.save(model, str(tmp))
    os.replace(tmp, dest)


def _feeds(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs for the stage's graph inputs (:func:`rkpart.ir.tensors.random_feeds`; a symbolic
    dimension taken as 1)."""
    inits = {t.name for t in model.graph.initializer}
    specs = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        specs.append((vi.name, dt, tuple(d.dim_value if d.HasField("dim_value") else 1 for d in tt.shape.dim)))
    try:
        return random_feeds(specs, seed)
    except UserError:
        dt = next(d for _, d, _ in specs if d.kind not in "fiub")
        raise ToolkitError(f"cannot make inputs of type {dt} to check the prepared stage") from None


def _finite_reference(model: onnx.ModelProto, seed: int) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """Seeded inputs and the stage's outputs on them, preferring inputs whose outputs are finite.

    A stage can compute NaN from random inputs outside its domain (Sana-WM's camera attention
    normalises a pose by a square root: 1024 NaN on the first seed), and a check against a
    reference holding NaN fails whatever the copy does.  Other seeds, then the same draws made
    positive, are tried; the first finite reference wins, else the first seed's (the check then
    asks for NaN and Inf in the same places, :func:`_check`).
    """
    first: tuple[dict[str, np.ndarray], list[np.ndarray]] | None = None
    for k in range(3):
        feeds = _feeds(model, seed + k)
        for cand in (feeds, {n: (np.abs(v) + v.dtype.type(0.5)) if v.dtype.kind == "f" else v
                             for n, v in feeds.items()}):
            ref = _run(model, cand)
            if all(r.dtype.kind != "f" or bool(np.isfinite(r).all()) for r in ref):
                return cand, ref
            first = first or (cand, ref)
    assert first is not None
    return first


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    try:
        so = ort.SessionOptions()
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.log_severity_level = 3
        sess = ort.InferenceSession(model.SerializeToString(), sess_options=so, providers=["CPUExecutionProvider"])
        return [np.asarray(x) for x in sess.run(output_names=None, input_feed=feeds)]
    except Exception as e:  # noqa: BLE001 - any ORT refusal of a prepared copy is a one-line build failure
        raise ToolkitError(f"ONNX Runtime cannot run the prepared stage: {str(e).splitlines()[0][:200]}") from None


def _check(ref: list[np.ndarray], got: list[np.ndarray], gate: Gate | Callable[[np.ndarray], Gate],
           what: str) -> None:
    """Raise when an output of ``got`` fails ``gate`` against ``ref`` (``gate``: one for all, or per reference)."""
    for r, g in zip(ref, got, strict=True):
        if r.dtype.kind != "f":
            if not np.array_equal(r, g):
                raise ToolkitError(f"{what}: integer/bool outputs differ")
            continue
        if g.shape == r.shape and not np.isfinite(r).all():
            # no finite reference could be drawn (_finite_reference): the same NaN and Inf in the same
            # places, and the finite values within the gate
            same = np.array_equal(np.isnan(g), np.isnan(r)) and np.array_equal(np.isposinf(g), np.isposinf(r)) \
                and np.array_equal(np.isneginf(g), np.isneginf(r))
            if not same:
                raise ToolkitError(f"{what}: NaN/Inf in other places than the original stage's")
            keep = np.isfinite(r)
            g, r = np.where(keep, g, 0), np.where(keep, r, 0)
        fails = (gate if isinstance(gate, Gate) else gate(r)).failures(compare(g, r))
        if fails:
            raise ToolkitError(f"{what}: {'; '.join(fails)}")
