"""Choose a candidate and a residency per block: least predicted latency within a memory budget.

Pipeline latency of one image (``passes = steps x (2 if cfg else 1)``):

* per-stage residency: ``passes x (load + init + infer + release + host)`` per block, and
  only one NPU stage is loaded at a time;
* resident: ``load + init + release`` once, ``passes x (infer + host)``, and the block's
  stages stay loaded for the whole run.

Device memory of the pipeline = the sum over resident blocks + the largest per-stage
stage.  The choice minimises total latency subject to that memory ``<= budget`` and to
the accuracy floor (predicted error ratio ``<= max_error_ratio``), by dynamic programming
over blocks (runs of fused blocks are segments) for every possible per-stage peak.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rkpart.cost_model.candidates import Candidate, mark_exclusions
from rkpart.cost_model.model import CostModel
from rkpart.errors import BudgetError, UserError
from rkpart.targets.known_issues import crash_patterns

MIB = float(1 << 20)
RESIDENCIES = ("per-stage", "resident")
LIFE = ("load", "init", "release")


@dataclass(frozen=True)
class SelectionConfig:
    """What ``--strategy auto`` was asked to optimise."""

    budget_mib: float | None = None
    toolkit: str | None = None  # None: the cost model's own toolkit
    steps: int = 1
    cfg: bool = True
    residencies: tuple[str, ...] = RESIDENCIES
    max_error_ratio: float | None = None  # None: the cost model's default floor
    max_run: int = 2  # longest run of fused blocks among the candidates (the pipeline builds them)
    compiled: tuple[str, ...] = ()
    plugins: bool = True  # plugin strategies' partitions are candidates too

    @property
    def passes(self) -> int:
        return self.steps * (2 if self.cfg else 1)


@dataclass(frozen=True)
class Option:
    """A candidate under one residency, with its predictions for the whole pipeline."""

    candidate: Candidate
    residency: str
    load: float
    init: float
    infer: float
    release: float
    host: float
    latency: float
    device_bytes: int  # while the candidate's stages are loaded (max or sum of stages)
    pss_bytes: int | None
    error_ratio: float | None
    excluded: str | None

    @property
    def key(self) -> str:
        return f"{self.candidate.id}/{self.residency}"

    def to_json(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate.id, "residency": self.residency, "blocks": list(self.candidate.blocks),
            "npu_stages": len(self.candidate.npu),
            "load_s": _r(self.load), "init_s": _r(self.init), "infer_s": _r(self.infer), "release_s": _r(self.release),
            "host_s": _r(self.host), "latency_s": _r(self.latency),
            "device_mib": round(self.device_bytes / MIB, 2),
            "pss_peak_mib": None if self.pss_bytes is None else round(self.pss_bytes / MIB, 2),
            "error_ratio": self.error_ratio, "excluded": self.excluded,
        }


def _r(x: float) -> float:
    return float(f"{x:.6g}")


def evaluate(c: Candidate, residency: str, model: CostModel, cfg: SelectionConfig, max_ratio: float) -> Option:
    """Predicted components of ``c`` under ``residency`` over the whole pipeline run."""
    p = cfg.passes
    preds = model.predict(c.npu)

    def total(name: str) -> float:
        vals = [pr.get(name) for pr in preds]
        if any(v is None for v in vals):
            raise UserError(f"the cost model has no {name!r} predictor; refit it or use the shipped calibration")
        return float(sum(v for v in vals if v is not None))

    calls = p if residency == "per-stage" else 1
    load, init, release = (total(n) * calls for n in LIFE)
    infer = total("infer") * p
    host = 0.0
    if c.host is not None:
        hp = model.predict_stage(c.host).get("host")
        if hp is None:
            raise UserError("the cost model has no 'host' predictor; refit it or use the shipped calibration")
        host = hp * p
    dev = [float(pr.get("device_mem") or 0.0) for pr in preds]
    device = max(dev) if residency == "per-stage" else sum(dev)
    pss_vals = [pr.get("pss_peak") for pr in preds]
    pss = None if any(v is None for v in pss_vals) or not pss_vals else int(max(v for v in pss_vals if v is not None))
    fam = model.accuracy.get("families", {}).get(c.accuracy_key)
    ratio = None if fam is None else float(fam["ratio"])
    excluded = c.excluded
    if excluded is None and ratio is not None and ratio > max_ratio:
        excluded = f"accuracy: predicted error {ratio:g}x the most accurate partition's > floor {max_ratio:g}x"
    return Option(candidate=c, residency=residency, load=load, init=init, infer=infer, release=release, host=host,
                  latency=load + init + infer + release + host, device_bytes=math.ceil(device), pss_bytes=pss,
                  error_ratio=ratio, excluded=excluded)


@dataclass
class Selection:
    """The choice per block and everything considered, for ``--explain`` / ``--json``."""

    config: SelectionConfig
    options: dict[int, list[Option]]  # by first block
    chosen: list[Option]  # in block order, covering every block once
    device_bytes: int
    latency: float
    model_provenance: dict[str, Any]
    toolkit: str | None
    max_error_ratio: float
    notes: list[str] = field(default_factory=list)

    def choice_for(self, block: int) -> Option:
        for o in self.chosen:
            if block in o.candidate.blocks:
                return o
        raise KeyError(block)

    def reason(self, o: Option) -> str:
        if o.excluded:
            return f"excluded: {o.excluded}"
        ch = self.choice_for(o.candidate.start)
        if o is ch:
            return "chosen: least predicted pipeline latency within budget and accuracy floor"
        if self.config.budget_mib is not None and o.device_bytes > self.config.budget_mib * MIB:
            return f"over budget alone ({o.device_bytes / MIB:.1f} > {self.config.budget_mib:g} MiB)"
        d = o.latency - ch.latency
        if d > 0:
            return f"slower: +{d:.4g} s ({d / ch.latency * 100:+.2f} %)"
        return "faster, but does not fit the budget together with the other blocks' choices"

    def to_json(self) -> dict[str, Any]:
        blocks = []
        for start in sorted(self.options):
            blocks.append({
                "block": start,
                "chosen": self.choice_for(start).key,
                "candidates": [{**o.to_json(), "reason": self.reason(o)} for o in self.options[start]],
            })
        return {
            "budget_mib": self.config.budget_mib, "toolkit": self.toolkit, "steps": self.config.steps,
            "cfg": self.config.cfg, "passes": self.config.passes, "max_error_ratio": self.max_error_ratio,
            "predicted_latency_s": _r(self.latency), "predicted_device_mib": round(self.device_bytes / MIB, 2),
            "choices": [{"blocks": list(o.candidate.blocks), "candidate": o.candidate.id, "residency": o.residency}
                        for o in self.chosen],
            "blocks": blocks, "cost_model": self.model_provenance, "notes": list(self.notes),
        }

    def render(self, blocks: Sequence[int] | None = None) -> str:
        """The explanation: a table per block (``blocks``: which ones; default all)."""
        lines = [f"auto: {self.config.passes} passes ({self.config.steps} steps x "
                 f"{2 if self.config.cfg else 1} CFG), toolkit {self.toolkit or 'any'}, "
                 f"budget {'none' if self.config.budget_mib is None else f'{self.config.budget_mib:g} MiB'}, "
                 f"accuracy floor {self.max_error_ratio:g}x"]
        hdr = (f"  {'candidate':<18} {'residency':<9} {'load s':>8} {'init s':>8} {'infer s':>8} {'release s':>9} "
               f"{'host s':>7} {'total s':>8} {'dev MiB':>8} {'err x':>6}  reason")
        for start in sorted(self.options):
            if blocks is not None and start not in blocks:
                continue
            ch = self.choice_for(start)
            lines.append(f"block {start}: chosen {ch.key}")
            lines.append(hdr)
            for o in self.options[start]:
                mark = "*" if o is ch else " "
                err = "-" if o.error_ratio is None else f"{o.error_ratio:.3g}"
                lines.append(
                    f"{mark} {o.candidate.id:<18} {o.residency:<9} {o.load:>8.4f} {o.init:>8.4f} {o.infer:>8.4f} "
                    f"{o.release:>9.4f} {o.host:>7.4f} {o.latency:>8.4f} {o.device_bytes / MIB:>8.1f} {err:>6}  "
                    f"{self.reason(o)}")
            base = _find(self.options[start], "split", "per-stage")
            for o in self.options[start]:
                if base is not None and o.residency == "per-stage" and o.candidate.id != "split" \
                        and o.candidate.blocks == base.candidate.blocks:
                    lines.append("  " + delta_line(base, o))
        lines.append(f"predicted pipeline: {self.latency:.4f} s of block time, device memory "
                     f"{self.device_bytes / MIB:.1f} MiB")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


def _find(opts: Sequence[Option], cid: str, residency: str) -> Option | None:
    return next((o for o in opts if o.candidate.id == cid and o.residency == residency), None)


def _pct(a: float, b: float) -> str:
    return "n/a" if a == 0 else f"{(b - a) / a * 100:+.1f} %"


def delta_line(base: Option, other: Option) -> str:
    """``other`` vs ``base`` per component, in the write-up's terms (NPU inference, host, memory)."""
    return (f"{other.candidate.id} vs {base.candidate.id} (per-stage): load {_pct(base.load, other.load)}, "
            f"init {_pct(base.init, other.init)}, NPU inference {_pct(base.infer, other.infer)}, "
            f"release {_pct(base.release, other.release)}, host AdaLN {_pct(base.host, other.host)}, "
            f"total {_pct(base.latency, other.latency)}, device-mapped memory "
            f"{_pct(base.device_bytes, other.device_bytes)}")


def deltas(base: Option, other: Option) -> dict[str, float | None]:
    """Relative change (fraction) of each component from ``base`` to ``other``."""
    def rel(a: float, b: float) -> float | None:
        return None if a == 0 else (b - a) / a

    return {"load": rel(base.load, other.load), "init": rel(base.init, other.init),
            "infer": rel(base.infer, other.infer), "release": rel(base.release, other.release),
            "host": rel(base.host, other.host), "latency": rel(base.latency, other.latency),
            "device_mem": rel(base.device_bytes, other.device_bytes)}


# -- optimisation ----------------------------------------------------------------------------


def _segments(options: Mapping[int, Sequence[Option]], order: Sequence[int]) -> list[list[tuple[int, Option]]]:
    """Per block position: (segment length, option) pairs of usable options starting there."""
    pos = {b: i for i, b in enumerate(order)}
    out: list[list[tuple[int, Option]]] = [[] for _ in order]
    for start, lst in options.items():
        for o in lst:
            if o.excluded is None:
                out[pos[start]].append((len(o.candidate.blocks), o))
    return out


def _solve(segs: list[list[tuple[int, Option]]], budget: float | None) -> tuple[float, list[Option], int] | None:
    """Least-latency cover of all blocks; ``None`` if none fits ``budget`` (bytes)."""
    n = len(segs)
    peaks = sorted({o.device_bytes for s in segs for _, o in s if o.residency == "per-stage"} | {0})
    best: tuple[float, list[Option], int] | None = None
    unit = MIB  # resident memory is counted in whole MiB, rounded up: never under-estimated
    for peak in peaks:
        if budget is not None and peak > budget:
            break
        cap = None if budget is None else int((budget - peak) // unit)
        size = 1 if cap is None else cap + 1
        dp = np.full((n + 1, size), math.inf)
        # how each (block position, resident MiB) state was reached: index into `moves`
        came = np.full((n + 1, size), -1, dtype=np.int64)
        moves: list[tuple[int, int, Option]] = []  # (from position, memory units, option)
        dp[0, 0] = 0.0
        for i in range(n):
            for ln, o in segs[i]:
                if i + ln > n or (o.residency == "per-stage" and o.device_bytes > peak):
                    continue
                w = 0 if o.residency == "per-stage" or cap is None else math.ceil(o.device_bytes / unit)
                if cap is not None and w > cap:
                    continue
                cand = dp[i, : size - w] + o.latency
                tgt = dp[i + ln, w:]
                better = cand < tgt - 1e-12
                if better.any():
                    tgt[better] = cand[better]
                    came[i + ln, w:][better] = len(moves)
                    moves.append((i, w, o))
        m_end = int(np.argmin(dp[n]))
        if not math.isfinite(dp[n, m_end]):
            continue
        chosen: list[Option] = []
        i, m = n, m_end
        while i > 0:
            pi, w, o = moves[int(came[i, m])]
            chosen.append(o)
            i, m = pi, m - w
        chosen.reverse()
        used = _memory(chosen)
        lat = float(dp[n, m_end])
        if best is None or lat < best[0] - 1e-12 or (abs(lat - best[0]) <= 1e-12 and used < best[2]):
            best = (lat, chosen, used)
    return best


def _memory(chosen: Sequence[Option]) -> int:
    res = sum(o.device_bytes for o in chosen if o.residency == "resident")
    per = max((o.device_bytes for o in chosen if o.residency == "per-stage"), default=0)
    return res + per


def _smallest_feasible(segs: list[list[tuple[int, Option]]]) -> tuple[int, list[Option]] | None:
    """The least device memory any cover of the blocks needs (latency ignored)."""
    n = len(segs)
    peaks = sorted({o.device_bytes for s in segs for _, o in s if o.residency == "per-stage"} | {0})
    best: tuple[int, list[Option]] | None = None
    for peak in peaks:
        empty: list[Option] = []
        dp: list[tuple[float, list[Option]]] = [(0.0, empty)] + [(math.inf, empty)] * n
        for i in range(n):
            if not math.isfinite(dp[i][0]):
                continue
            for ln, o in segs[i]:
                if i + ln > n or (o.residency == "per-stage" and o.device_bytes > peak):
                    continue
                w = o.device_bytes if o.residency == "resident" else 0
                if dp[i][0] + w < dp[i + ln][0]:
                    dp[i + ln] = (dp[i][0] + w, [*dp[i][1], o])
        if math.isfinite(dp[n][0]):
            total = int(dp[n][0]) + peak
            if best is None or total < best[0]:
                best = (total, dp[n][1])
    return best


def choose(
    candidates: Mapping[int, Sequence[Candidate]],
    model: CostModel,
    config: SelectionConfig = SelectionConfig(),
    *,
    notes: Sequence[str] = (),
) -> Selection:
    """Choose a candidate and residency for every block among ``candidates``.

    ``candidates`` maps each block index to the candidates starting there
    (:func:`rkpart.cost_model.candidates.candidates_from`); ``notes`` (e.g. plugin strategies
    that were not considered) are passed on to the :class:`Selection`.

    Raises
    ------
    BudgetError
        No combination fits ``config.budget_mib``; the message names the smallest budget that
        would fit.
    UserError
        Every candidate of some block is excluded (toolkit crash, accuracy floor).
    """
    if config.steps < 1:
        raise UserError(f"steps must be >= 1, got {config.steps}")
    bad = [r for r in config.residencies if r not in RESIDENCIES]
    if bad or not config.residencies:
        raise UserError(f"residency must be among {', '.join(RESIDENCIES)}, got {bad or 'nothing'}")
    toolkit = config.toolkit or model.provenance.get("toolkit")
    max_ratio = config.max_error_ratio if config.max_error_ratio is not None else float(
        model.accuracy.get("default_max_ratio", math.inf))
    notes = list(notes)
    # the target's table first; rows a cost-model file carries beyond it are honoured too
    known = [p.to_json() for p in crash_patterns()]
    known += [dict(r) for r in model.known_issues or () if dict(r) not in known]
    cands = mark_exclusions(candidates, toolkit=toolkit, known_issues=known,
                            compiled=[str(Path(c)) for c in config.compiled])
    options = {start: [evaluate(c, r, model, config, max_ratio) for c in lst for r in config.residencies]
               for start, lst in cands.items()}
    order = sorted(candidates)
    segs = _segments(options, order)
    for i in range(len(segs)):
        covered = any(i in range(j, j + ln) for j in range(len(segs)) for ln, _ in segs[j])
        if not covered:
            why = "; ".join(sorted({f"{o.candidate.id}: {o.excluded}" for o in options[order[i]]}))
            raise UserError(f"block {order[i]}: every candidate is excluded ({why})")
    budget = None if config.budget_mib is None else config.budget_mib * MIB
    best = _solve(segs, budget)
    if best is None:
        smallest = _smallest_feasible(segs)
        if smallest is None:
            raise UserError("no combination of candidates covers every block")
        need, how = smallest
        what = ", ".join(sorted({f"{o.candidate.id}/{o.residency}" for o in how}))
        raise BudgetError(
            f"no partition fits --budget-mib {config.budget_mib:g}: the smallest feasible budget is "
            f"{math.ceil(need / MIB * 10) / 10:.1f} MiB ({what})"
        )
    lat, chosen, used = best
    return Selection(config=config, options=options, chosen=chosen, device_bytes=used, latency=lat,
                     model_provenance={k: model.provenance.get(k) for k in ("source", "device", "runtime", "toolkit")},
                     toolkit=toolkit, max_error_ratio=max_ratio, notes=notes)


__all__ = ["Option", "Selection", "SelectionConfig", "choose", "delta_line", "deltas", "evaluate"]
