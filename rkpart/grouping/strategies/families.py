"""The candidate families: the one module that names them.

A *family* is a way of partitioning every block the same way, proposed by a strategy with
fixed options; ``auto`` (:mod:`rkpart.auto`) slices each family's whole-model partition
per block into candidates for the cost model (:mod:`rkpart.cost_model.candidates`), ``auto
--toolkit`` compiles one block per anatomy of each (``grounding.ground_candidates``), and
``rkpart tune`` profiles each (:mod:`rkpart.tune`).  The families:

``split``            one NPU stage per branch, AdaLN + gates + residuals on the host
``split-adaln-npu``  one NPU stage per branch with its AdaLN inside; residuals on the host
``fused``            the whole block (AdaLN, residuals, modulation) in one NPU stage
``fused-xK``         K consecutive blocks in one NPU stage (``FusedStrategy``, ``blocks_per_stage=K``),
                     K = 2 .. ``max_run``; every start block, not only multiples of K
``<plugin>``         any registered strategy whose stages each stay inside one block

Precision is a dimension on top of every family (``auto --option precisions=fp16,int8``): the
int8 (w8a8) variant of family ``F`` is the candidate ``F@int8`` (:func:`precision_id`), the
same stages built quantized; :func:`split_precision` gives the family and precision back.

:func:`candidate_id_for` maps a plan's strategy and options back to its family.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rkpart.discovery.structure import Discovery
from rkpart.grouping.groups import Partition
from rkpart.grouping.strategies.base import propose_with
from rkpart.grouping.strategies.fused import FusedStrategy
from rkpart.grouping.strategies.split import SplitStrategy
from rkpart.ir import ModelGraph
from rkpart.types import JsonMap

#: strategies that are not families of their own: built into the families below, or (``custom``,
#: ``auto``, ``generic``) not a per-block grouping that ``auto`` could choose from
OWN_STRATEGIES = frozenset({"split", "fused", "custom", "auto", "generic"})


@dataclass(frozen=True)
class Family:
    """One candidate family: its id, the strategy and options that propose it, and the options
    its candidates record (``Candidate.options``)."""

    id: str
    strategy: str
    options: JsonMap = field(default_factory=dict)
    recorded: JsonMap = field(default_factory=dict)

    @property
    def blocks_per_stage(self) -> int:
        return int(self.options.get("blocks_per_stage", 1))

    def propose(self, mg: ModelGraph, disc: Discovery) -> list[Partition]:
        """The whole-model partitions of this family: one, or for ``fused-xK`` one per start offset
        ``0 .. K-1`` (blocks before the offset each their own stage), so that a run of K blocks may
        start at any block."""
        if self.strategy == "split":
            return [propose_with(SplitStrategy(), mg, disc, self.options)]
        if self.strategy == "fused":
            k = self.blocks_per_stage
            offsets = [o for o in range(k) if o + k <= len(disc.blocks)] if k > 1 else [0]
            return [propose_with(FusedStrategy(first_run=o), mg, disc, self.options) for o in offsets]
        raise ValueError(f"family {self.id}: strategy {self.strategy} is proposed by the pipeline")


SPLIT = Family("split", "split", {}, {"strategy": "split", "adaln": "host"})
SPLIT_ADALN_NPU = Family("split-adaln-npu", "split", {"adaln": "npu"}, {"strategy": "split", "adaln": "npu"})
FUSED = Family("fused", "fused", {}, {"strategy": "fused", "blocks_per_stage": 1})


def fused_run(k: int) -> Family:
    """``fused-xK``: runs of ``k`` >= 2 consecutive blocks in one NPU stage."""
    return Family(f"fused-x{k}", "fused", {"blocks_per_stage": k}, {"strategy": "fused", "blocks_per_stage": k})


def families(max_run: int = 2, blocks: int | None = None) -> tuple[Family, ...]:
    """The built-in families in order: ``split``, ``split-adaln-npu``, ``fused``, then ``fused-xK``
    for K = 2 .. ``max_run`` (at most ``blocks``, when given)."""
    top = max_run if blocks is None else min(max_run, blocks)
    return (SPLIT, SPLIT_ADALN_NPU, FUSED, *(fused_run(k) for k in range(2, top + 1)))


def candidate_id_for(strategy: str, options: JsonMap) -> str | None:
    """The family a plan made with ``strategy``/``options`` belongs to (or ``None``)."""
    if strategy == "split":
        if options.get("adaln") == "npu":
            return SPLIT_ADALN_NPU.id
        return SPLIT.id if options.get("residual", "host") == "host" else None
    if strategy == "fused":
        k = int(options.get("blocks_per_stage", 1))
        return FUSED.id if k == 1 else fused_run(k).id
    return strategy if strategy not in OWN_STRATEGIES else None


#: the precisions ``auto`` can choose per block: fp16 (every family) and int8 (w8a8, RK3588's one
#: quantized type; hybrid is not a candidate: which layers it keeps in float16 is known only after a build)
CANDIDATE_PRECISIONS = ("fp16", "int8")
_PRECISION_SEP = "@"


def precision_id(family_id: str, precision: str) -> str:
    """The candidate id of ``family_id`` built in ``precision`` (fp16: the family id itself)."""
    return family_id if precision == "fp16" else f"{family_id}{_PRECISION_SEP}{precision}"


def split_precision(candidate_id: str) -> tuple[str, str]:
    """(family id, precision) of a candidate id made by :func:`precision_id`."""
    fam, sep, prec = candidate_id.rpartition(_PRECISION_SEP)
    return (fam, prec) if sep and prec in CANDIDATE_PRECISIONS else (candidate_id, "fp16")


__all__ = ["CANDIDATE_PRECISIONS", "FUSED", "OWN_STRATEGIES", "SPLIT", "SPLIT_ADALN_NPU", "Family", "candidate_id_for",
           "families", "fused_run", "precision_id", "split_precision"]
