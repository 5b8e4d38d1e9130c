"""Read op placement (NPU or CPU) and the last optimiser step from a toolkit build log.

No toolkit API reports placement; a verbose build prints a "Network Layer Information
Table" whose ``Target`` column says where each layer runs::

    D RKNN: [15:17:11.727] ID   OpType    DataType Target InputShape  OutputShape ... FullName
    D RKNN: [15:17:11.727] 5    Erf       FLOAT16  CPU    (1,8,1,16)  (1,8,1,16)  ... Erf:e

The table can be printed more than once in one log (the toolkit builds a check model
first); the last one describes the exported model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PREFIX = re.compile(r"^.*?RKNN: \[[^\]]*\]\s?")
_TARGETS = ("CPU", "NPU", "GPU")
_IO_OPS = ("InputOperator", "OutputOperator")


@dataclass(frozen=True)
class PlacedOp:
    """One row of the layer table."""

    id: int
    op_type: str
    dtype: str
    target: str
    name: str  # the table's FullName, e.g. ``Erf:/block/Erf``


def _strip(line: str) -> str:
    return _PREFIX.sub("", line.rstrip("\n"), count=1)


def layer_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every "Network Layer Information Table" of ``text``: its header's tokens and its rows' tokens.

    A table's rows run from the header (the line starting ``ID``) to its closing rule; a row that
    does not start with a layer id also ends it.  The shape columns never contain spaces, so a
    row splits into one token per column (the full name last).
    """
    tables: list[tuple[list[str], list[list[str]]]] = []
    rows: list[list[str]] | None = None
    header: list[str] | None = None
    for raw in text.splitlines():
        line = _strip(raw)
        if "Network Layer Information Table" in line:
            rows, header = [], None
            continue
        if rows is None:
            continue
        toks = line.split()
        if header is None:
            if toks and toks[0] == "ID":
                header = toks
                tables.append((header, rows))
            continue
        if not toks or set(line.strip()) <= {"-", "+"}:
            if rows:  # closing rule of the table
                rows = None
            continue
        if not toks[0].isdigit():
            rows = None
            continue
        rows.append(toks)
    return tables


def parse_layer_table(text: str) -> list[PlacedOp]:
    """Rows of the last "Network Layer Information Table" in ``text`` (empty if none)."""
    tables = layer_tables(text)
    out: list[PlacedOp] = []
    for toks in tables[-1][1] if tables else []:
        if len(toks) < 4:
            break
        # the target is the first of CPU/NPU/GPU after the data type; the full name is the last column
        target = next((t for t in toks[2:5] if t in _TARGETS), "")
        out.append(PlacedOp(id=int(toks[0]), op_type=toks[1], dtype=toks[2], target=target, name=toks[-1]))
    return out


def cpu_ops(text: str) -> tuple[str, ...]:
    """Full names of the layers placed on the CPU, input/output operators excluded."""
    rows = parse_layer_table(text)
    return tuple(op.name for op in rows if op.target == "CPU" and op.op_type not in _IO_OPS)


_FUSE_RULE = re.compile(r"^D\s{2,}([A-Za-z_][\w]*):\s+(remove|add) node")
_PHASE = re.compile(r"^D ([A-Za-z_]\w*) \.\.\.\s*$")
_NATIVE_START = re.compile(r">>>>>> start: (\S+)")
_NATIVE_END = re.compile(r"<<<<<<<< end: (\S+)")


#: rknn-toolkit2's warning (2.3.0, 2.5.0) when it drops outputs its constant folding computed
CONSTANT_OUTPUTS = "of model are constants, remove it from RKNN model"


def missing_outputs(text: str, outputs: list[str]) -> list[str] | None:
    """The stage ``outputs`` a build's layer table has no ``OutputOperator`` for, when it has fewer
    of those than ``outputs`` (``None``: as many, or no table).  rknn-toolkit2 builds one output for
    tensors it finds equal (:mod:`rkpart.ir.values`) and drops outputs its constant folding computed
    (:data:`CONSTANT_OUTPUTS`): such an ``.rknn`` returns fewer tensors than the stage declares."""
    rows = [r for r in parse_layer_table(text) if r.op_type == "OutputOperator"]
    if not rows or len(rows) >= len(outputs):
        return None
    named = {r.name.split(":", 1)[-1] for r in rows}
    return [t for t in outputs if t not in named] or list(outputs[len(rows):])


def last_step(text: str) -> str | None:
    """The last graph-optimiser step the log shows, for failure messages.

    That is the last rule that rewrote something (e.g. ``fuse_exnorm_mul``), else the last
    optimiser phase (``fuse_ops``); ``None`` if the log has neither.
    """
    rule = phase = None
    for raw in text.splitlines():
        line = raw.rstrip()
        m = _FUSE_RULE.match(line)
        if m:
            rule = m.group(1)
            continue
        m = _PHASE.match(line)
        if m:
            phase = m.group(1)
    return rule or phase


def open_native_pass(text: str) -> str | None:
    """The native compiler pass that started but never ended (where a crash happened), if any."""
    open_pass: str | None = None
    for raw in text.splitlines():
        m = _NATIVE_START.search(raw)
        if m:
            open_pass = m.group(1)
            continue
        if _NATIVE_END.search(raw):
            open_pass = None
    return open_pass
