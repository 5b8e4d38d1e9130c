"""``split``: one NPU stage per residual branch (attention, cross-attention, FFN, ...).

AdaLN, gates and residual adds run on the host by default, as in the hand-made Anima
deployment (84 NPU models for 28 blocks).  ``adaln="npu"`` moves each branch's
normalisation + modulation into its NPU stage; ``residual="npu"`` moves the gate and the
residual add there too.  The modulation *vectors* (``SiLU -> Linear`` of the timestep
embedding) depend only on the timestep and stay on the host unless ``modulation="npu"``:
then each branch's own modulation layers join its NPU stage when its AdaLN is there, and
whatever remains (or all of it, with AdaLN on the host) becomes one NPU stage per block.
Token-wise matmul work that discovery reads as a branch's AdaLN (ahead of its norm: WanVACE's
hint projections, added to the stream before the next block) is not a modulation: with AdaLN
on the host it becomes an NPU stage of its own (``<block>.<region>.pre``), and so does
token-wise work read as modulation (its patch embedding, ``<block>.mod.tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rkpart.discovery.structure import Discovery
from rkpart.grouping.strategies.base import GroupBuilder, Partition, Strategy, block_id, option
from rkpart.ir import ModelGraph
from rkpart.ir.work import token_macs
from rkpart.types import Device, JsonMap


@dataclass(frozen=True)
class SplitOptions:
    """Where each part of a block runs: ``host`` or ``npu``."""

    adaln: Device = "host"
    residual: Device = "host"
    modulation: Device = "host"

    @classmethod
    def from_mapping(cls, options: JsonMap) -> SplitOptions:
        return cls(*(option(options, k, "host", ("host", "npu")) for k in ("adaln", "residual", "modulation")))


class SplitStrategy(Strategy[SplitOptions]):
    name = "split"
    accepts = ("adaln", "residual", "modulation")
    summary = "one NPU stage per residual branch; AdaLN/gates/residuals on the host by default"
    Options = SplitOptions

    def propose(self, mg: ModelGraph, disc: Discovery | None, opts: SplitOptions = SplitOptions()) -> Partition:
        assert disc is not None
        adaln, residual, modulation = opts.adaln, opts.residual, opts.modulation
        gb = GroupBuilder()
        for b in disc.blocks:
            bid = block_id(b)
            for r in b.regions:
                npu = set(r.core)
                if adaln == "npu":
                    npu |= r.pre
                    if modulation == "npu":
                        # this branch's own modulation layers can only join it if its AdaLN is there too
                        npu |= r.mod
                if residual == "npu":
                    npu |= r.gate | r.adds
                kind = r.name + ("+adaln" if adaln == "npu" and r.pre else "") + (
                    "+residual" if residual == "npu" else "")
                gb.add(f"{bid}.{r.name}", npu, device="npu", region=r.name, kind=kind, block=b.index,
                       blocks=(b.index,))
            # the rest of the modulation: its own stage, on the device asked for
            mod = set(b.mod) | {i for r in b.regions for i in r.mod}
            if modulation == "host":
                # token-wise matmul work read as modulation (a control stream's patch embedding) is not
                tok = set(token_macs(mg, mod))
                mod -= tok
                gb.add(f"{bid}.mod.tokens", tok, device="npu", region="mod", kind="token-matmul", block=b.index,
                       blocks=(b.index,))
            gb.add(f"{bid}.mod", mod, device=modulation, region="mod", kind="modulation", block=b.index,
                   blocks=(b.index,))
            for r in b.regions:
                pre = set(r.pre)
                if adaln == "host":
                    # token-wise matmul work read as this branch's AdaLN (a control stream's hint
                    # projection added to the stream ahead of the norm): not a modulation, so on the NPU
                    tok = set(token_macs(mg, r.pre))
                    pre -= tok
                    gb.add(f"{bid}.{r.name}.pre", tok, device="npu", region=r.name, kind="token-matmul",
                           block=b.index, blocks=(b.index,))
                gb.add(f"{bid}.{r.name}.adaln", pre, device="host", region="adaln", kind="adaln",
                       block=b.index, blocks=(b.index,))
                gb.add(f"{bid}.{r.name}.residual", set(r.gate | r.adds), device="host", region="residual",
                       kind="gate+residual" if r.gate else "residual", block=b.index, blocks=(b.index,))
        gb.add_host_rest(mg, disc)
        return gb.build(self.name, {"adaln": adaln, "residual": residual, "modulation": modulation})
