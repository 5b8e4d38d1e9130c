"""Bring a stage down to the opset a toolkit loads.

Every rknn-toolkit2 rkpart supports loads default-domain opset <= 19
(:attr:`rkpart.targets.base.ToolkitCaps.max_opset`; measured on 2.3.0, 2.3.2 and 2.5.0:
a one-Relu model loads and builds at opsets 12-19 and fails at 20 with "Unsupport onnx
opset 20, need <= 19!").  torch's default exporter (dynamo, since torch 2.9) writes opset 20.

Lowering, per stage, when it is prepared for one toolkit:

1. refuse ops that have no form below their opset (:data:`~rkpart.targets.rewrites.NO_LOWERING`);
2. apply the ``lower`` rows of :data:`rkpart.targets.rewrites.REWRITES` (ops with no
   ``onnx.version_converter`` adapter, e.g. Gelu-20 -> the Erf or Tanh form);
3. run ``onnx.version_converter`` for everything else (Reduce* axes, Split, Pad, Resize,
   DFT, IsNaN/IsInf ...), carrying :data:`~rkpart.targets.rewrites.TYPE_ONLY_CHANGES` ops
   through unchanged and keeping large weights out of the converter's copy.

Checking the result under ONNX Runtime is the caller's job (:mod:`rkpart.compile.prepare`):
this package never runs a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx
from onnx import helper

from rkpart.errors import ToolkitError
from rkpart.targets.rewrites import NO_LOWERING, TYPE_ONLY_CHANGES, apply_rewrites, rewrites_for
from rkpart.types import JsonObject

#: private domain that hides type-only-changed ops from the converter (restored afterwards)
_KEEP_DOMAIN = "ai.rkpart.keep"
#: initializers at least this big go around the converter (it serialises the whole model)
_BIG = 1 << 16


@dataclass(frozen=True)
class Lowering:
    """What :func:`lower_model` did to one stage (recorded per stage in plan.json)."""

    from_opset: int
    to_opset: int
    toolkit: str
    rewrites: dict[str, int] = field(default_factory=dict)  # rewrite name -> matches

    def to_json(self) -> JsonObject:
        return {"from_opset": self.from_opset, "to_opset": self.to_opset, "toolkit": self.toolkit,
                "rewrites": dict(sorted(self.rewrites.items()))}

    def describe(self) -> str:
        extra = ", ".join(f"{k} x{v}" for k, v in sorted(self.rewrites.items()))
        return f"opset {self.from_opset} -> {self.to_opset}" + (f" ({extra})" if extra else "")


def model_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain opset (0 if it imports none)."""
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 0


def lowering_note(opset: int, toolkits: dict[str, int]) -> str | None:
    """"stages will be lowered from opset 20 to 19 for rknn-toolkit2 2.3.0, 2.5.0", or ``None``.

    ``toolkits`` maps version -> max opset.
    """
    by_target: dict[int, list[str]] = {}
    for v, mx in sorted(toolkits.items()):
        if opset > mx:
            by_target.setdefault(mx, []).append(v)
    if not by_target:
        return None
    parts = [f"to {mx} for rknn-toolkit2 {', '.join(vs)}" for mx, vs in sorted(by_target.items())]
    return f"stages will be lowered from opset {opset} " + "; ".join(parts)


def lower_model(model: onnx.ModelProto, to_opset: int, toolkit: str) -> tuple[onnx.ModelProto, Lowering]:
    """A copy of ``model`` at default-domain opset ``to_opset`` and what was done to get there.

    Raises
    ------
    ToolkitError
        An op cannot be written below its opset, or the converter failed (the message names
        the op or repeats the converter's reason in one line).
    """
    src = model_opset(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    if src <= to_opset:
        return out, Lowering(src, src, toolkit)
    g = out.graph
    stuck = sorted({n.op_type for n in g.node if n.domain in ("", "ai.onnx") and n.op_type in NO_LOWERING})
    if stuck:
        op = stuck[0]
        raise ToolkitError(f"cannot lower {op} from opset {src} to {to_opset} for rknn-toolkit2 {toolkit}: "
                           f"{NO_LOWERING[op]}")
    done = apply_rewrites(out, rewrites_for(toolkit, "lower"))
    kept = [n for n in g.node if n.domain in ("", "ai.onnx") and n.op_type in TYPE_ONLY_CHANGES]
    for n in kept:
        n.domain = _KEEP_DOMAIN
    if kept:
        out.opset_import.append(helper.make_opsetid(_KEEP_DOMAIN, 1))
    big = [t for t in g.initializer if _nbytes(t) >= _BIG]
    if big:
        # weights become graph inputs for the converter's copy, then initializers again
        names = {t.name for t in big}
        rest = [t for t in g.initializer if t.name not in names]
        del g.initializer[:]
        g.initializer.extend(rest)
        for t in big:
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    try:
        conv = onnx.version_converter.convert_version(out, to_opset)
    except Exception as e:  # noqa: BLE001 - the converter raises RuntimeError/IndexError/...; one line for the user
        raise ToolkitError(f"cannot lower the stage from opset {src} to {to_opset} for rknn-toolkit2 "
                           f"{toolkit}: {_first_line(e)}") from None
    cg = conv.graph
    for n in cg.node:
        if n.domain == _KEEP_DOMAIN:
            n.domain = ""
    imports = [o for o in conv.opset_import if o.domain != _KEEP_DOMAIN]
    del conv.opset_import[:]
    conv.opset_import.extend(imports)
    if big:
        names = {t.name for t in big}
        inputs = [i for i in cg.input if i.name not in names]
        del cg.input[:]
        cg.input.extend(inputs)
        cg.initializer.extend(big)
    return conv, Lowering(src, to_opset, toolkit, done)


def _nbytes(t: onnx.TensorProto) -> int:
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return _BIG
    return len(t.raw_data) if t.raw_data else 0


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    line = text.splitlines()[0]
    # the converter prefixes its C++ source location: keep the reason only
    return line.split("failed: ", 1)[-1]


__all__ = ["Lowering", "lower_model", "lowering_note", "model_opset"]
