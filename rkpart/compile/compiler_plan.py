"""Read the compiler's own plan of a stage from its verbose build log.

Every verbose rknn-toolkit2 build prints, besides the ``Target`` column that
:mod:`rkpart.compile.placement` reads, two things rkpart used to throw away:

* per layer of the "Network Layer Information Table": ``Cycles(DDR/NPU/Total)`` and
  ``RW(KB)``::

      ID   OpType  DataType Target InputShape            OutputShape  Cycles(DDR/NPU/Total)  RW(KB)  FullName
      3    Conv    FLOAT16  NPU    (1,96,1,64),(96,...)  (1,96,1,64)  1819/1152/1819         30      Conv:/to_v/MatMul

  Only Conv-type layers carry cycles (NPU cycles = MACs / 512 per core in fp16); attention,
  norm, GELU, Transpose and elementwise layers print ``0/0/0`` but do carry RW;
* after the memory statistics pass: ``Total Internal Memory Size: 228KB`` and ``Total Weight
  Memory Size: 173KB`` (``KB``/``MB``/``GB`` are binary units, as the rest of the toolkit's
  output).  Published: these equal ``eval_memory()``'s weight and internal memory on a board.

The table can be printed more than once in one log (a check model is built first); the last
one describes the exported model, as does the last memory statistic.  A log without a table
or a statistic gives ``None`` for what is missing, never 0.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rkpart.compile.placement import _IO_OPS, layer_tables
from rkpart.compile.runner import read_log
from rkpart.errors import SpecError, UserError
from rkpart.io import atomic_write_bytes
from rkpart.readers import FileKind
from rkpart.types import MULTICORE_OPS, CompilerPlan, JsonMap, JsonObject

_CYCLES = re.compile(r"^(\d+)/(\d+)/(\d+)$")
_MEMORY = re.compile(r"Total (Weight|Internal) Memory Size:\s*([0-9]+(?:\.[0-9]+)?)\s*(B|KB|MB|GB)\b")
_UNIT = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
_TARGETS = ("CPU", "NPU", "GPU")
#: version of the per-layer side file (``rknn/layers/<key>.json``)
LAYERS_VERSION = 1


@dataclass(frozen=True)
class LayerRow:
    """One row of the layer table, cycles and RW included."""

    id: int
    op_type: str
    dtype: str
    target: str
    inputs: str  # the InputShape column as printed, e.g. ``(1,96,1,64),(96,96,1,1)``
    outputs: str
    cycles_ddr: int
    cycles_npu: int
    cycles_total: int
    rw_bytes: int
    name: str

    def to_json(self) -> list[Any]:
        # a list, not an object: a fused block's table has thousands of rows
        return [self.id, self.op_type, self.dtype, self.target, self.inputs, self.outputs, self.cycles_ddr,
                self.cycles_npu, self.cycles_total, self.rw_bytes, self.name]


#: the order of :meth:`LayerRow.to_json`'s list, written into the side file
LAYER_COLUMNS = ("id", "op_type", "dtype", "target", "inputs", "outputs", "cycles_ddr", "cycles_npu",
                 "cycles_total", "rw_bytes", "name")


def parse_layer_rows(text: str) -> list[LayerRow] | None:
    """Rows of the last layer table with a cycles column (``None``: the log has no such table)."""
    tables = [rows for header, rows in layer_tables(text) if any(t.startswith("Cycles") for t in header)]
    if not tables:
        return None
    out: list[LayerRow] = []
    for toks in tables[-1]:
        row = _row(toks)
        if row is None:
            break
        out.append(row)
    return out


def _row(toks: list[str]) -> LayerRow | None:
    if len(toks) < 8 or not toks[0].isdigit():
        return None
    # the shape columns never contain spaces: the cycles column is the one token a/b/c
    at = next((i for i in range(3, len(toks)) if _CYCLES.match(toks[i])), None)
    if at is None or at + 1 >= len(toks) or not toks[at + 1].isdigit():
        return None
    m = _CYCLES.match(toks[at])
    assert m is not None
    target = toks[3] if toks[3] in _TARGETS else next((t for t in toks[2:5] if t in _TARGETS), "")
    shapes = toks[4:at] if toks[3] == target else toks[3:at]
    ins, outs = (shapes[0], shapes[-1]) if len(shapes) >= 2 else ((shapes or [""])[0], "")
    return LayerRow(id=int(toks[0]), op_type=toks[1], dtype=toks[2], target=target, inputs=ins, outputs=outs,
                    cycles_ddr=int(m.group(1)), cycles_npu=int(m.group(2)), cycles_total=int(m.group(3)),
                    rw_bytes=int(toks[at + 1]) * 1024, name=" ".join(toks[at + 2:]))


def parse_memory(text: str) -> tuple[int | None, int | None]:
    """(weight bytes, internal bytes) of the last memory statistic each (``None`` where absent)."""
    found: dict[str, int] = {}
    for raw in text.splitlines():
        m = _MEMORY.search(raw)
        if m:
            found[m.group(1)] = round(float(m.group(2)) * _UNIT[m.group(3)])
    return found.get("Weight"), found.get("Internal")


def summarise(rows: list[LayerRow] | None, weight: int | None, internal: int | None,
              layers_file: str | None = None) -> CompilerPlan:
    """The typed summary of a layer table and the two memory figures."""
    if rows is None:
        return CompilerPlan(weight_bytes=weight, internal_bytes=internal, layers=0, cycles_ddr=None,
                            cycles_npu=None, cycles_total=None, rw_bytes=None, layers_file=None)
    cycled: Counter[str] = Counter()
    for r in rows:
        if r.cycles_total or r.cycles_npu or r.cycles_ddr:
            cycled[r.op_type] += 1
    ops = Counter(r.op_type for r in rows)
    return CompilerPlan(
        weight_bytes=weight, internal_bytes=internal, layers=len(rows),
        cycles_ddr=sum(r.cycles_ddr for r in rows), cycles_npu=sum(r.cycles_npu for r in rows),
        cycles_total=sum(r.cycles_total for r in rows), rw_bytes=sum(r.rw_bytes for r in rows),
        by_op=tuple(sorted(ops.items())), by_dtype=tuple(sorted(Counter(r.dtype for r in rows).items())),
        by_target=tuple(sorted(Counter(r.target for r in rows if r.target and r.op_type not in _IO_OPS).items())),
        uncycled_ops=tuple(sorted(op for op in ops if not cycled[op] and op not in _IO_OPS)),
        multicore_cycles=sum(r.cycles_total for r in rows if r.op_type in MULTICORE_OPS),
        layers_file=layers_file)


def read_compiler_plan(text: str) -> tuple[CompilerPlan, list[LayerRow] | None]:
    """The compiler's plan of the build whose log is ``text``, and its rows."""
    rows = parse_layer_rows(text)
    weight, internal = parse_memory(text)
    return summarise(rows, weight, internal), rows


def layers_json(rows: list[LayerRow]) -> bytes:
    """The per-layer side file's bytes (deterministic: same table, same bytes)."""
    doc = {"format": "rkpart-compiler-layers", "version": LAYERS_VERSION, "columns": list(LAYER_COLUMNS),
           "rows": [r.to_json() for r in rows]}
    return (json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def _check_layers(doc: Any, where: str) -> None:
    """:data:`LAYERS_KIND`'s check: rkpart's layer table of this version, every row complete."""
    if not isinstance(doc, dict) or doc.get("format") != "rkpart-compiler-layers" or \
            doc.get("version") != LAYERS_VERSION or doc.get("columns") != list(LAYER_COLUMNS):
        raise SpecError(f"{where}: not an rkpart compiler layer table (version {LAYERS_VERSION})")
    rows = doc.get("rows", [])
    if not isinstance(rows, list):
        raise SpecError(f"{where}: 'rows' is not a list")
    for i, r in enumerate(rows):
        if not isinstance(r, list) or len(r) != len(LAYER_COLUMNS):
            raise SpecError(f"{where}: layer row {i} is not {len(LAYER_COLUMNS)} columns")
        try:
            LayerRow(*r)
        except (TypeError, ValueError) as e:
            raise SpecError(f"{where}: layer row {i} is malformed ({e})") from None


#: a plan's per-layer side file (``rknn/layers/<key>.json``), read by ``bundle`` (core masks) and ``report``
LAYERS_KIND = FileKind("compiler layer table", "json", 256 << 20, SpecError, check=_check_layers, symlinks=False,
                       doc="a plan's `rknn/layers/<key>.json`, read by `bundle` and `report`")


def read_layers(path: Path, root: Path | None = None) -> list[LayerRow]:
    """Rows of a side file written by :func:`artifact_compiler_plan` (:class:`SpecError` if it is not one)."""
    return [LayerRow(*r) for r in LAYERS_KIND.load(path, root=root).get("rows", [])]



@dataclass(frozen=True)
class FeatureTensor:
    """One row of the compiler's "Feature Tensor Information Table": an activation buffer of internal memory.

    Printed by every verbose build beside the memory statistics, one row per buffer a layer uses: its
    output, and the layer's scratch buffers (``..._exSecondary``: an attention's workspace, a norm's
    second buffer).  ``start``/``end`` are byte offsets in internal memory; the largest ``end`` is the
    "Total Internal Memory Size".  ``peak`` marks the row the compiler starred (``*``): where it
    reached its peak.
    """

    layer: int  #: the layer table's id of the op using the buffer
    user: str  #: that op's type (``exSDPAttention``, ``exNorm``, ``ConvExGelu``, ...)
    tensor: str
    dtype: str
    layout: str  #: ``UNDEFINED``, ``NC1HWC2``, ...
    shape: tuple[int, ...]  #: the tensor's shape (OrigShape)
    native: tuple[int, ...]  #: as the buffer holds it (NativeShape)
    start: int
    end: int
    size: int
    peak: bool = False


def _dims(tok: str) -> tuple[int, ...] | None:
    if not (tok.startswith("(") and tok.endswith(")")):
        return None
    try:
        return tuple(int(x) for x in tok[1:-1].split(",") if x)
    except ValueError:
        return None


def parse_feature_tensors(text: str) -> list[FeatureTensor] | None:
    """Rows of the last "Feature Tensor Information Table" of a build log (``None``: the log has none)."""
    from rkpart.compile.placement import _strip

    tables: list[list[FeatureTensor]] = []
    rows: list[FeatureTensor] | None = None
    header = False
    for raw in text.splitlines():
        line = _strip(raw)
        if "Feature Tensor Information Table" in line:
            rows, header = [], False
            tables.append(rows)
            continue
        if rows is None:
            continue
        if not header:
            header = line.split()[:1] == ["ID"]
            continue
        if set(line.strip()) <= {"-", "+"}:
            if rows:  # the closing rule
                rows = None
            continue
        row = _feature_row(line)
        if row is None:
            rows = None
            continue
        rows.append(row)
    return tables[-1] if tables else None


def _feature_row(line: str) -> FeatureTensor | None:
    """``ID User Tensor DataType DataFormat OrigShape NativeShape | Start End Size``; the peak row has a ``*``
    between Start and End."""
    left, sep, right = line.partition("|")
    toks, nums = left.split(), right.replace("*", " * ").split()
    peak = "*" in nums
    nums = [t for t in nums if t != "*"]
    if not sep or len(toks) < 7 or not toks[0].isdigit() or len(nums) != 3:
        return None
    shape, native = _dims(toks[-2]), _dims(toks[-1])
    try:
        start, end, size = (int(x, 16) for x in nums)
    except ValueError:
        return None
    if shape is None or native is None:
        return None
    return FeatureTensor(layer=int(toks[0]), user=toks[1], tensor=" ".join(toks[2:-4]), dtype=toks[-4],
                         layout=toks[-3], shape=shape, native=native, start=start, end=end, size=size, peak=peak)


# -- between a build, the cache entry and the plan's artifact ---------------------------------
#: where a plan folder keeps the per-layer rows of its builds, one file per build key
LAYERS_DIR = "rknn/layers"


def compiler_meta(text: str) -> JsonObject:
    """What a cache entry records of the compiler's plan: the summary and the rows (so that a
    cached build gives its plan the same figures as a fresh one, with no log at hand)."""
    summary, rows = read_compiler_plan(text)
    return {"compiler": summary.to_json(), "compiler_layers": None if rows is None else [r.to_json() for r in rows]}


def artifact_compiler_plan(folder: Path, key: str, meta: JsonMap) -> CompilerPlan | None:
    """The artifact's :class:`CompilerPlan` from a cache entry, writing its per-layer side file
    into ``folder``; an entry of an older rkpart reads its build log, if the plan still has it.
    ``None`` when neither says anything (never a plan of zeros)."""
    raw = meta.get("compiler")
    rows: list[LayerRow] | None
    try:
        if isinstance(raw, Mapping):
            summary = CompilerPlan.from_json(raw)
            layer_rows = meta.get("compiler_layers")
            rows = None if layer_rows is None else [LayerRow(*r) for r in layer_rows]
        else:
            log = meta.get("log")
            path = folder / str(log) if isinstance(log, str) else None
            if path is None or path.is_symlink() or not path.is_file():
                return None
            summary, rows = read_compiler_plan(read_log(path, folder))
    except (ValueError, TypeError, OSError, UserError):
        return None  # a damaged entry: the artifact says nothing rather than something wrong
    if rows:
        rel = f"{LAYERS_DIR}/{key}.json"
        target = folder / rel
        data = layers_json(rows)
        if not (target.is_file() and not target.is_symlink() and target.read_bytes() == data):
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, data)
        summary = dataclasses.replace(summary, layers_file=rel)
    return summary


__all__ = ["LAYERS_DIR", "LAYER_COLUMNS", "LayerRow", "artifact_compiler_plan", "compiler_meta", "layers_json",
           "parse_layer_rows", "parse_memory", "read_compiler_plan", "read_layers", "summarise"]
