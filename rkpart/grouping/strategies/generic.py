"""``generic``: consecutive segments that each fit a memory budget; no block knowledge needed.

The ops are taken in model order (a topological order) and cut into consecutive segments.
A segment's *footprint* is its weight bytes plus its peak activation bytes, under this
memory model (documented in ``docs/plugins.md``):

* weights: every initializer the segment's ops read (shared ones once);
* activations: every tensor the segment reads or writes occupies memory from the op that
  produces it (or the segment's start, for a segment input) until its last consumer in the
  whole model (or the segment's end, for a segment output).  The peak is the largest sum
  over the segment's steps.

Extending a segment at either end never lowers its footprint, so for every start there is
one furthest end that fits (found with two pointers), and the segmentation is a shortest
path over cut positions: fewest segments first, then the fewest bytes crossing the cuts,
then the fewest tensors.  Cuts therefore land where the live set is small — between
transformer layers rather than inside attention — without knowing what a layer is.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from rkpart.discovery.structure import Discovery
from rkpart.errors import BudgetError, UserError
from rkpart.grouping.strategies.base import GroupBuilder, Partition, Strategy, option
from rkpart.ir import ModelGraph
from rkpart.targets import get_target
from rkpart.types import Device, JsonMap
from rkpart.units import MIB

#: used when neither ``budget_mib`` nor ``budget_bytes`` is given: the default target's stage
#: budget (RK3588: a quarter of the NPU's 4 GiB window, leaving room for the runtime and the
#: next stage's weights; :meth:`rkpart.targets.base.Target.default_budget_bytes`)
DEFAULT_BUDGET_MIB = get_target().default_budget_bytes() / MIB


@dataclass(frozen=True)
class Segment:
    """One segment: ops ``order[start:end]`` of :class:`Schedule` and its estimated memory."""

    start: int
    end: int
    weight_bytes: int
    activation_bytes: int
    cut_bytes: int  # bytes of the tensors crossing the cut in front of the segment (0 for the first)
    cut_tensors: int

    @property
    def footprint(self) -> int:
        return self.weight_bytes + self.activation_bytes


class Schedule:
    """Model order of ``mg``'s ops with per-tensor lifetimes: what the footprints are computed from.

    Positions (``0 .. n-1``) index :attr:`order`; a cut at position ``c`` separates
    ``order[:c]`` from ``order[c:]``.
    """

    def __init__(self, mg: ModelGraph) -> None:
        self.mg = mg
        self.order: list[int] = sorted(mg.ops.nodes)  # load_model keeps nodes topologically sorted
        n = self.n = len(self.order)
        if n == 0:
            raise UserError(f"{mg.path.name}: the model has no non-constant ops to partition")

        # tensors: producer position (-1 for model inputs), sorted use positions, last live step
        life = mg.lifetimes(self.order)
        self.names, self.prod, self.uses = life.names, life.born, life.uses
        self.last, self.nbytes = life.last, life.nbytes

        # live bytes per step in the whole-model schedule, and a sparse table for range maxima
        live = life.live_bytes()
        self._rmq = [live]
        span = 1
        while 2 * span <= n:
            prev = self._rmq[-1]
            self._rmq.append(np.maximum(prev[:-span], prev[span:]))
            span *= 2

        # weights: per-step bytes (with multiplicity) plus the initializers read at several steps
        per_step = np.zeros(n + 1, dtype=np.int64)
        w_uses: dict[str, list[int]] = {}
        for k, op in enumerate(self.order):
            for w in self._weights_of(op):
                w_uses.setdefault(w, []).append(k)
                per_step[k + 1] += mg.weight_bytes(w)
        self.op_weights = per_step[1:].copy()
        self._wprefix = np.cumsum(per_step)
        self._shared = [(mg.weight_bytes(w), u) for w, u in sorted(w_uses.items()) if len(u) > 1]

        # tensors alive at each cut position: p < c <= last
        self._born: list[list[int]] = [[] for _ in range(n + 1)]
        for i, (p, lv) in enumerate(zip(self.prod, self.last, strict=True)):
            if lv >= p + 1:
                self._born[int(p) + 1].append(i)

    def _weights_of(self, op: int) -> tuple[str, ...]:
        return self.mg.subgraph([op]).weights  # read directly or through constant ops

    # -- footprints --------------------------------------------------------------------------
    def max_live(self, s: int, e: int) -> int:
        """Largest whole-model live bytes over steps ``s .. e-1``."""
        j = (e - s).bit_length() - 1
        t = self._rmq[j]
        return int(max(t[s], t[e - (1 << j)]))

    def weight_bytes(self, s: int, e: int) -> int:
        w = int(self._wprefix[e] - self._wprefix[s])
        for b, u in self._shared:
            cnt = bisect.bisect_left(u, e) - bisect.bisect_left(u, s)
            if cnt > 1:
                w -= b * (cnt - 1)
        return w

    def alive(self, c: int, prev: list[int] | None = None) -> list[int]:
        """Tensors alive at cut position ``c`` (``prev``: the answer for ``c - 1``)."""
        base = prev if prev is not None else [i for k in range(c) for i in self._born[k]]
        return [i for i in [*base, *self._born[c]] if self.last[i] >= c]

    def next_use(self, i: int, c: int) -> int:
        u = self.uses[i]
        j = bisect.bisect_left(u, c)
        return u[j] if j < len(u) else math.inf  # type: ignore[return-value]


class _Window:
    """Footprints of segments starting at one position ``s``, for increasing ends."""

    def __init__(self, sch: Schedule, s: int, alive: list[int]) -> None:
        self.sch, self.s = sch, s
        pairs = sorted((sch.next_use(i, s), int(sch.nbytes[i])) for i in alive)
        self._next = [p for p, _ in pairs]
        self._cum = np.cumsum([0, *(b for _, b in pairs)])
        self.cut_bytes = int(sum(b for p, b in pairs if p != math.inf))
        self.cut_tensors = sum(1 for p, _ in pairs if p != math.inf)

    def activation(self, e: int) -> int:
        # tensors alive at s that the segment never reads pass over it: live in the whole-model
        # profile on every step of the segment, but not part of the segment's memory
        used = bisect.bisect_left(self._next, e)
        passing = int(self._cum[-1] - self._cum[used])
        return self.sch.max_live(self.s, e) - passing

    def footprint(self, e: int) -> int:
        return self.sch.weight_bytes(self.s, e) + self.activation(e)


def segment(mg: ModelGraph, budget_bytes: int) -> tuple[Schedule, list[Segment]]:
    """Cut ``mg`` into the fewest consecutive segments that fit ``budget_bytes``.

    Among those, the cuts minimise the bytes (then the number of tensors) crossing them.

    Raises
    ------
    BudgetError
        Some op does not fit the budget on its own; the message gives the smallest budget
        that works.
    """
    sch = Schedule(mg)
    n = sch.n
    windows: list[_Window] = []
    alive: list[int] = []
    maxend: list[int] = []
    worst = (0, 0)  # (footprint, step) of the largest single op
    e = 1
    for s in range(n):
        alive = sch.alive(s, alive if s else None)
        w = _Window(sch, s, alive)
        windows.append(w)
        single = w.footprint(s + 1)
        if single > worst[0]:  # the first of equally large ops is the one reported
            worst = (single, s)
        e = max(e, s + 1)
        while e < n and w.footprint(e + 1) <= budget_bytes:
            e += 1
        maxend.append(e)
    if worst[0] > budget_bytes:
        op = mg.op(sch.order[worst[1]])
        w_b = int(sch.op_weights[worst[1]])
        raise BudgetError(
            f"op {op.name or sch.order[worst[1]]!r} ({op.op_type}) alone needs {_mib(worst[0])} MiB "
            f"(weights {_mib(w_b)}, activations {_mib(worst[0] - w_b)}), more than the budget of "
            f"{_mib(budget_bytes)} MiB; the smallest feasible budget is {_mib_up(worst[0])} MiB "
            f"({worst[0]} bytes)"
        )

    # shortest path over cut positions; cost = (segments, crossing bytes, crossing tensors)
    inf = (math.inf, math.inf, math.inf)
    best: list[tuple[float, float, float]] = [inf] * (n + 1)
    back = [0] * (n + 1)
    best[0] = (0, 0, 0)
    dq: deque[tuple[tuple[float, float, float], int]] = deque()
    nxt = 0  # next start position to enter the window
    for end in range(1, n + 1):
        while nxt < end:
            w = windows[nxt]
            cut = (1, w.cut_bytes, w.cut_tensors) if nxt else (1, 0, 0)
            key = (best[nxt][0] + cut[0], best[nxt][1] + cut[1], best[nxt][2] + cut[2])
            while dq and dq[-1][0] >= key:
                dq.pop()
            dq.append((key, nxt))
            nxt += 1
        while dq and maxend[dq[0][1]] < end:
            dq.popleft()
        if not dq:  # pragma: no cover - impossible once every single op fits
            raise BudgetError(f"no segmentation fits the budget of {_mib(budget_bytes)} MiB")
        best[end], back[end] = dq[0]

    cuts = [n]
    while cuts[-1] > 0:
        cuts.append(back[cuts[-1]])
    cuts.reverse()
    segs = []
    for s, e in itertools.pairwise(cuts):
        w = windows[s]
        segs.append(Segment(start=s, end=e, weight_bytes=sch.weight_bytes(s, e), activation_bytes=w.activation(e),
                            cut_bytes=w.cut_bytes if s else 0, cut_tensors=w.cut_tensors if s else 0))
    return sch, segs


def budget_from_options(options: JsonMap) -> int:
    """The budget in bytes: ``budget_mib`` or ``budget_bytes``, else the target's default stage
    budget (``target``, default rk3588), optionally for a board with ``board_ram_mib`` of RAM
    and a ``ram_share`` other than the target's."""
    mib = options.get("budget_mib")
    raw = options.get("budget_bytes")
    if mib is not None and raw is not None:
        raise UserError("give either budget_mib or budget_bytes, not both")
    try:
        if mib is not None:
            b = int(float(mib) * MIB)
        elif raw is not None:
            b = int(raw)
        else:
            ram = options.get("board_ram_mib")
            share = options.get("ram_share")
            return get_target(options.get("target")).default_budget_bytes(
                None if ram is None else int(float(ram) * MIB), None if share is None else float(share))
    except (TypeError, ValueError):
        bad = next(v for v in (raw, mib, options.get("board_ram_mib"), options.get("ram_share")) if v is not None)
        raise UserError(f"budget must be a number, got {bad!r}") from None
    if b <= 0:
        raise UserError(f"budget must be positive, got {b} bytes")
    return b


@dataclass(frozen=True)
class GenericOptions:
    """The budget per segment in bytes (:func:`budget_from_options`) and the segments' device."""

    budget_bytes: int
    device: Device = "npu"

    @classmethod
    def from_mapping(cls, options: JsonMap) -> GenericOptions:
        return cls(budget_from_options(options), option(options, "device", "npu", ("npu", "host")))


class GenericStrategy(Strategy[GenericOptions]):
    """Consecutive NPU segments under a memory budget, cut where few and small tensors cross.

    Options: ``budget_mib`` (float) or ``budget_bytes`` (int), default the target's stage
    budget (RK3588: 1024 MiB, a quarter of the NPU's 4 GiB window; ``board_ram_mib`` and
    ``ram_share`` derive it for a board with less RAM, ``target`` names another chip), and
    ``device`` (``npu`` or ``host``) for the segments.

    Examples
    --------
    >>> from rkpart import partition
    >>> plan = partition("vit.onnx", "build/", strategy="generic", budget_mib=64)  # doctest: +SKIP
    >>> [s.id for s in plan.stages]  # doctest: +SKIP
    ['seg00', 'seg01', 'seg02']
    """

    name = "generic"
    accepts = ("budget_mib", "budget_bytes", "board_ram_mib", "ram_share", "target", "device")
    summary = "consecutive segments whose weights + peak activations fit --budget-mib; any model"
    needs_blocks = False
    Options = GenericOptions

    def propose(self, mg: ModelGraph, disc: Discovery | None, opts: GenericOptions | None = None) -> Partition:
        opts = opts or GenericOptions.from_mapping({})
        budget, device = opts.budget_bytes, opts.device
        sch, segs = segment(mg, budget)
        width = max(2, len(str(len(segs) - 1)))
        gb = GroupBuilder()
        notes = []
        for idx, sg in enumerate(segs):
            gid = f"seg{idx:0{width}d}"
            gb.add(gid, set(sch.order[sg.start:sg.end]), device=device, region="segment", kind="segment")
            notes.append(
                f"{gid}: {sg.end - sg.start} ops, weights {_mib(sg.weight_bytes)} MiB + activations "
                f"{_mib(sg.activation_bytes)} MiB = {_mib(sg.footprint)} MiB; cut in front: "
                f"{sg.cut_tensors} tensor(s), {_mib(sg.cut_bytes)} MiB"
            )
        gb.hoist_index_work(mg)
        return gb.build(self.name, {"budget_bytes": budget, "device": device}, tuple(notes))


def _mib(n: int) -> str:
    return f"{n / MIB:.2f}"


def _mib_up(n: int) -> str:
    return f"{math.ceil(n / MIB * 100) / 100:.2f}"


__all__ = ["DEFAULT_BUDGET_MIB", "GenericOptions", "GenericStrategy", "Schedule", "Segment", "budget_from_options",
           "segment"]
