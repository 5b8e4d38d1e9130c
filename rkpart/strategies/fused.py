"""``fused``: one NPU stage per block (or per run of ``blocks_per_stage`` consecutive blocks).

AdaLN, gates, residual adds and the block's own modulation layers are inside the stage;
only computations shared by all blocks (timestep embedding, RoPE tables, ...) and the
prologue/epilogue run on the host.
"""

from __future__ import annotations

from typing import Any

from rkpart.errors import UserError
from rkpart.ir import ModelGraph
from rkpart.partitioner.discovery import Discovery
from rkpart.strategies.base import GroupBuilder, Partition, Strategy, block_id, option


class FusedStrategy(Strategy):
    name = "fused"
    accepts = ("blocks_per_stage", "modulation")
    summary = "one NPU stage per block (or per run of N blocks), AdaLN and residuals inside"

    def propose(self, mg: ModelGraph, disc: Discovery | None, **options: Any) -> Partition:
        assert disc is not None
        n = int(option(options, "blocks_per_stage", 1))
        if n < 1:
            raise UserError(f"blocks_per_stage must be >= 1, got {n}")
        modulation = option(options, "modulation", "npu", ("host", "npu"))
        gb = GroupBuilder()
        blocks = list(disc.blocks)
        for start in range(0, len(blocks), n):
            run = blocks[start:start + n]
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
