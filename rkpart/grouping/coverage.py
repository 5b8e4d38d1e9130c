"""NPU coverage: the share of the blocks' matrix work a partition places in NPU stages.

The blocks' work is the multiply-accumulates of their MatMul / Gemm / Conv ops that compute
more than :data:`rkpart.ir.work.GEMV_ROWS` rows (token-wise layers and attention products),
and of such ops in the glue between blocks (WanVACE's hint projections, added to the stream
between blocks); the per-step modulation GEMVs, which belong on the host, do not count, nor
do the prologue's and epilogue's (patch embedding, final projection).  A partition that
leaves a block's projection on the host loses that work to the CPU: ``partition`` warns
below :data:`MIN_SHARE`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from rkpart.discovery.structure import Discovery
from rkpart.grouping.strategies.base import propose_with
from rkpart.grouping.strategies.fused import FusedStrategy
from rkpart.grouping.strategies.split import SplitStrategy
from rkpart.ir import ModelGraph
from rkpart.ir.work import token_macs

#: ``partition`` warns when less than this share of the blocks' MACs is on the NPU
MIN_SHARE = 0.99


class _Placed(Protocol):
    @property
    def device(self) -> str: ...

    @property
    def ops(self) -> frozenset[int]: ...


@dataclass(frozen=True)
class Coverage:
    npu_macs: int
    block_macs: int
    host_ops: tuple[int, ...]  # the blocks' counted ops left off the NPU, largest first

    @property
    def share(self) -> float:
        return 1.0 if self.block_macs == 0 else self.npu_macs / self.block_macs

    def to_json(self) -> dict[str, object]:
        return {"share": round(self.share, 6), "npu_macs": self.npu_macs, "block_macs": self.block_macs}


def npu_coverage(mg: ModelGraph, disc: Discovery, groups: Iterable[_Placed]) -> Coverage:
    """How much of the token-wise MAC work of the blocks and the glue between them ``groups`` put on the NPU."""
    macs = token_macs(mg, frozenset().union(disc.glue, *(b.ops for b in disc.blocks)))
    on_npu = {i for g in groups if g.device == "npu" for i in g.ops}
    npu = sum(m for i, m in macs.items() if i in on_npu)
    host = sorted((i for i in macs if i not in on_npu), key=lambda i: (-macs[i], i))
    return Coverage(npu_macs=npu, block_macs=sum(macs.values()), host_ops=tuple(host))


def coverage_note(mg: ModelGraph, cov: Coverage) -> str | None:
    """A warning when ``cov`` is below :data:`MIN_SHARE`, naming the largest ops left on the host."""
    if cov.share >= MIN_SHARE:
        return None
    names = ", ".join(mg.op_label(i) for i in cov.host_ops[:3])
    more = f" and {len(cov.host_ops) - 3} more" if len(cov.host_ops) > 3 else ""
    return (f"only {cov.share:.1%} of the blocks' matmul work is in NPU stages "
            f"(on the host: {names}{more})")



def strategy_coverage(mg: ModelGraph, disc: Discovery) -> dict[str, Coverage]:
    """NPU coverage of the ``split`` and ``fused`` proposals (``rkpart inspect``)."""
    return {name: npu_coverage(mg, disc, propose_with(cls(), mg, disc).groups)
            for name, cls in (("split", SplitStrategy), ("fused", FusedStrategy))}


__all__ = ["MIN_SHARE", "Coverage", "coverage_note", "npu_coverage", "strategy_coverage"]
