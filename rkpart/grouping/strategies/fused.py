"""``fused``: one NPU stage per block (or per run of ``blocks_per_stage`` consecutive blocks).

AdaLN, gates, residual adds and the block's own modulation layers are inside the stage;
only computations shared by all blocks (timestep embedding, RoPE tables, ...) and the
prologue/epilogue run on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

from rkpart.discovery.structure import Discovery
from rkpart.errors import UserError
from rkpart.grouping.strategies.base import GroupBuilder, Partition, Strategy, block_id, option
from rkpart.ir import ModelGraph
from rkpart.types import Device, JsonMap


@dataclass(frozen=True)
class FusedOptions:
    """``blocks_per_stage`` consecutive blocks per NPU stage; ``modulation`` inside (``npu``) or not."""

    blocks_per_stage: int = 1
    modulation: Device = "npu"

    @classmethod
    def from_mapping(cls, options: JsonMap) -> FusedOptions:
        n = int(option(options, "blocks_per_stage", 1))
        if n < 1:
            raise UserError(f"blocks_per_stage must be >= 1, got {n}")
        return cls(n, option(options, "modulation", "npu", ("host", "npu")))


class FusedStrategy(Strategy[FusedOptions]):
    name = "fused"
    accepts = ("blocks_per_stage", "modulation")
    summary = "one NPU stage per block (or per run of N blocks), AdaLN and residuals inside"
    Options = FusedOptions

    def __init__(self, first_run: int = 0) -> None:
        """``first_run``: the block index where runs of ``blocks_per_stage`` start; blocks before it
        are each their own stage (the candidate registry proposes runs from every offset,
        :mod:`rkpart.grouping.strategies.families`)."""
        self.first_run = first_run

    def propose(self, mg: ModelGraph, disc: Discovery | None, opts: FusedOptions = FusedOptions()) -> Partition:
        assert disc is not None
        n, modulation = opts.blocks_per_stage, opts.modulation
        gb = GroupBuilder()
        blocks = list(disc.blocks)
        head = min(self.first_run, len(blocks))
        runs = [blocks[i:i + 1] for i in range(head)] + [blocks[s:s + n] for s in range(head, len(blocks), n)]
        for run in runs:
            ids = tuple(b.index for b in run)
            gid = block_id(run[0]) if len(run) == 1 else f"{block_id(run[0])}-{block_id(run[-1])}"
            for b in run:
                ops = set(b.ops)
                if modulation == "host":
                    mod = set(b.mod) | {i for r in b.regions for i in r.mod}
                    ops -= mod
                    gb.add(f"{block_id(b)}.mod", mod, device="host", region="mod", kind="modulation",
                           block=b.index, blocks=(b.index,))
                gb.add(f"{gid}.block", ops, device="npu", region="block", kind="block", block=run[0].index,
                       blocks=ids)
        gb.add_host_rest(mg, disc)
        return gb.build(self.name, {"blocks_per_stage": n, "modulation": modulation})
