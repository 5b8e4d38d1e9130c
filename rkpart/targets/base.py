"""What a capability is: per target and rknn-toolkit2 version, which ops, opsets and memory fit.

Kept apart from grouping (:mod:`rkpart.grouping.strategies`) and from choosing (:mod:`rkpart.cost_model`),
as torch.fx keeps ``OperatorSupport`` apart from its partitioner and ONNX Runtime asks each
execution provider's ``GetCapability`` before it partitions.  Everything here is a fact about
the toolkit and the chip, answered from op types, attributes and numbers: this package never
looks at a whole graph and never imports rknn-toolkit2.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rkpart.errors import UserError
from rkpart.ir.graph import OpNode
from rkpart.targets.known_issues import CrashPattern, crash_patterns
from rkpart.units import GIB, MIB


class Support(str, enum.Enum):
    """Where an op can run once a stage holding it is built by the toolkit."""

    #: converted and placed on the NPU
    NPU = "npu"
    #: on the NPU only inside a fused pattern (exMatMul, exGelu, exNorm, exSDPAttention ...);
    #: alone it falls back to the CPU inside the ``.rknn``
    FUSED = "fused"
    #: built, but run on the CPU inside the ``.rknn`` (measured)
    CPU = "cpu"
    #: marked "Not Supported" by the operator list (or outside its attribute range) and not
    #: measured: the toolkit still builds such ops, rewritten into NPU ops or on the CPU
    UNLISTED = "unlisted"
    #: not an ONNX op (custom domain): the toolkit cannot load it
    NONE = "none"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class OpRule:
    """What one toolkit does with one ONNX op type (``note``: the doc's remark or the limit)."""

    op_type: str
    support: Support
    note: str = ""


@dataclass(frozen=True)
class AttrLimit:
    """The values of one attribute the operator list names; other values are :attr:`Support.UNLISTED`."""

    attr: str
    allowed: tuple[str | int, ...]
    default: str | int  # the ONNX default, for nodes without the attribute


@dataclass(frozen=True)
class ToolkitCaps:
    """One rknn-toolkit2 version's capabilities for one target.

    ``ops`` maps every ONNX op type of the toolkit's operator list (and every measured one) to
    its rule; any other op type is :attr:`Support.UNLISTED`.  ``max_opset`` is the highest
    default-domain opset ``load_onnx`` accepts.
    """

    version: str
    max_opset: int
    ops: Mapping[str, OpRule]
    source: str
    attrs: Mapping[str, tuple[AttrLimit, ...]] = field(default_factory=dict)
    #: op type -> (which inputs are constants, note): placed on the CPU in that form only
    #: (``Gather`` of a constant table by data indices; a ``Gather`` by constant indices is NPU)
    cpu_forms: Mapping[str, tuple[tuple[bool, ...], str]] = field(default_factory=dict)

    def op(self, op_type: str, domain: str = "") -> OpRule:
        """The rule for ``op_type`` (custom domains are never loadable)."""
        if domain not in ("", "ai.onnx"):
            return OpRule(op_type, Support.NONE, f"custom domain {domain!r}")
        return self.ops.get(op_type) or OpRule(op_type, Support.UNLISTED, "\"Not Supported\" in the operator list")

    def node(self, node: OpNode) -> OpRule:
        """The rule for one node: its op type's, unless an attribute is outside the listed range."""
        rule = self.op(node.op_type, node.domain)
        if rule.support not in (Support.NPU, Support.FUSED):
            return rule
        for lim in self.attrs.get(node.op_type, ()):
            value = node.attr(lim.attr, lim.default)
            value = value.decode() if isinstance(value, bytes) else value
            if value not in lim.allowed:
                return OpRule(node.op_type, Support.UNLISTED,
                              f"{lim.attr}={value!r} (listed: {', '.join(map(repr, lim.allowed))})")
        return rule

    def off_npu(self, nodes: Iterable[OpNode]) -> list[tuple[OpNode, OpRule]]:
        """The nodes among ``nodes`` not expected on the NPU (CPU, unlisted, not loadable), with their rules."""
        out = []
        for n in nodes:
            rule = self.node(n)
            if rule.support not in (Support.NPU, Support.FUSED):
                out.append((n, rule))
        return out

    def opset_problem(self, opset: int) -> str | None:
        """Why a model of ``opset`` cannot be loaded by this toolkit, or ``None`` if it can.

        The wording follows ``load_onnx``'s own error ("Unsupport onnx opset 20, need <= 19").
        Lowering rules that bring a model down to ``max_opset`` belong next to this module
        (``rkpart.targets.opset``), not in the callers.
        """
        if opset > self.max_opset:
            return (f"rknn-toolkit2 {self.version} loads ONNX opset <= {self.max_opset}, the model has opset "
                    f"{opset}")
        return None

    def crash_patterns(self) -> tuple[CrashPattern, ...]:
        """Graph patterns this toolkit is known to crash on (:mod:`rkpart.targets.known_issues`)."""
        return crash_patterns(self.version)


@dataclass(frozen=True)
class Target:
    """A chip rkpart builds for: its NPU memory window and its toolkits' capabilities.

    ``ram_share`` is the share of the memory window (or of the board's RAM, when that is
    smaller) one NPU stage may use by default: room is left for the runtime and for the next
    stage's weights, which are loaded while the current one still holds its own.
    """

    name: str
    npu_window_bytes: int
    toolkits: Mapping[str, ToolkitCaps]
    default_toolkit: str
    ram_share: float = 0.25
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: the board's RAM (shared with the OS and the rest of the application), if one is typical
    board_ram_bytes: int | None = None
    #: share of :attr:`board_ram_bytes` a whole partitioned pipeline may hold by default
    board_share: float = 0.5

    def caps(self, toolkit: str | None = None) -> ToolkitCaps:
        """Capabilities of ``toolkit`` (default: :attr:`default_toolkit`).

        A version without its own entry gets the newest documented one at or below it, or the
        oldest one: toolkits of one major line share their operator list (2.3.0 and 2.3.2
        publish identical ONNX tables).
        """
        version = toolkit or self.default_toolkit
        if version in self.toolkits:
            return self.toolkits[version]
        known = sorted(self.toolkits, key=_version_key)
        below = [v for v in known if _version_key(v) <= _version_key(version)]
        base = self.toolkits[below[-1] if below else known[0]]
        return ToolkitCaps(version=version, max_opset=base.max_opset, ops=base.ops, attrs=base.attrs,
                           source=f"{base.source} (as documented for {base.version})", cpu_forms=base.cpu_forms)

    def default_budget_bytes(self, board_ram_bytes: int | None = None, share: float | None = None) -> int:
        """Default memory budget of one NPU stage: ``share`` of the NPU window or the board RAM.

        Raises
        ------
        UserError
            ``share`` is not in (0, 1] or ``board_ram_bytes`` is not positive.
        """
        s = self.ram_share if share is None else share
        if not 0 < s <= 1:
            raise UserError(f"memory share must be in (0, 1], got {s:g}")
        if board_ram_bytes is not None and board_ram_bytes <= 0:
            raise UserError(f"board RAM must be positive, got {board_ram_bytes} bytes")
        window = self.npu_window_bytes if board_ram_bytes is None else min(self.npu_window_bytes, board_ram_bytes)
        return int(window * s)


    def pipeline_budget_bytes(self, board_ram_bytes: int | None = None, share: float | None = None) -> int:
        """Default memory budget of a whole pipeline (every resident block + the largest per-stage one).

        The NPU's addressable window, or ``share`` (default :attr:`board_share`) of the board's
        RAM when that is smaller: the rest of the RAM belongs to the OS, the text encoder and
        the VAE.  ``--strategy auto`` applies it when no ``--budget-mib`` is given.

        Raises
        ------
        UserError
            ``share`` is not in (0, 1] or ``board_ram_bytes`` is not positive.
        """
        s = self.board_share if share is None else share
        if not 0 < s <= 1:
            raise UserError(f"board RAM share must be in (0, 1], got {s:g}")
        ram = self.board_ram_bytes if board_ram_bytes is None else board_ram_bytes
        if ram is not None and ram <= 0:
            raise UserError(f"board RAM must be positive, got {ram} bytes")
        return self.npu_window_bytes if ram is None else min(self.npu_window_bytes, int(ram * s))

    def describe_pipeline_budget(self) -> str:
        """Where the default pipeline budget comes from, in one phrase."""
        ram = "" if self.board_ram_bytes is None else (
            f" and {self.board_share:g} of the board's {self.board_ram_bytes / GIB:g} GiB RAM")
        return f"target {self.name} default: the NPU's {self.npu_window_bytes / GIB:g} GiB window{ram}"


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in v.split("."))


def rules(supported: Mapping[str, str], *, fused: Mapping[str, str],
          measured: Mapping[str, OpRule]) -> dict[str, OpRule]:
    """Op rules from a toolkit's operator list (``supported``: op -> remark), placement facts
    (``fused``: op -> the patterns that keep it on the NPU) and measured builds of ops the list
    marks "Not Supported" or that were placed elsewhere than documented (``measured``: a
    measurement wins over the document)."""
    out: dict[str, OpRule] = {}
    for op, remark in supported.items():
        if op in fused:
            out[op] = OpRule(op, Support.FUSED, fused[op])
        else:
            out[op] = OpRule(op, Support.NPU, remark)
    out.update(measured)
    return out


__all__ = ["GIB", "MIB", "AttrLimit", "OpRule", "Support", "Target", "ToolkitCaps", "rules"]
