"""Rewrites weighed for memory: a rewrite that only changes a layout is kept where the compiler says it helps.

Most NPU rewrites move an op the toolkit would run on the CPU onto the NPU, or avoid a crash: they are
worth their memory.  A few change only how the compiler lays a tensor out (``Rewrite.weighed``:
``heads-table-layout`` on 2.5.0, ``rope-halves`` on 2.3.x), and what that does to device memory
depends on the stage's shapes.  Measured (docs/cost-model.md, onnx-built Anima at hidden 2048, fp16,
2.5.0): ``heads-table-layout`` takes the 512 px self-attention stage from 44.5 to 32.0 MiB of internal
memory, and costs the 1024 px fused block 45 MiB (357.02 against 312.02 MiB, 0 CPU layers either way).
No rule by shape predicts which: the stage is built both ways and the compiler's own figures decide.

:func:`judge` compares the two builds: fewer CPU layers first, then less device memory (the
compiler's weight + internal memory); equal, the build with fewer rewrites.  A build without the
figures, or a build without the rewrites that fails, keeps them (nothing says they cost anything).  A stage
that needs less than :data:`WEIGH_MIN_BYTES` of device memory with them is not weighed (tiny models: a
second build to save at most a few hundred KiB).

The verdict holds for every stage of one *anatomy* (:func:`rkpart.ir.anatomy.model_anatomy`: the graph without its
weights' values; blocks of one model share it and compile to equal tables), so one more build per
anatomy and toolkit is made, and the verdict is kept in the build cache (:class:`VerdictStore`, keyed by
the anatomy, toolkit, target, build config and the rewrite set): a rerun, or the next plan of the same
model, builds each stage once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx

from rkpart.errors import UserError
from rkpart.io import atomic_write_bytes
from rkpart.readers import FileKind
from rkpart.types import CompilerPlan, JsonMap, JsonObject

#: bump when the verdict's rule or record changes: cached verdicts are made again
WEIGH_VERSION = 1
#: the verdicts' folder in a plan's ``rknn/`` and in the shared build cache
WEIGH_DIR = "weigh"
#: why a weighed rewrite was left out (the stage's ``dropped_rewrites``); the figures are in its ``weighed`` record
WEIGHED_OUT = ("weighed for device memory: the build without it has no more CPU layers and no more device memory "
               "(the stage's prepared.weighed has both builds' figures; `rkpart compile --no-weigh-rewrites` keeps it)")
#: a stage whose build with the rewrites needs less device memory than this is not weighed: the most a layout
#: could cost it is not worth a build (the bundled example's self-attention: 0.24 MiB with heads-table-layout,
#: 0.33 without; the stages where it loses need hundreds: 204 MiB for 4 heads x 128 at 4096 tokens)
WEIGH_MIN_BYTES = 4 << 20
VERDICT_KIND = FileKind("weighed-rewrite verdict", "json", 1 << 20, UserError, symlinks=False,
                        doc="`weigh/<key>.json` of a plan's `rknn/` or a build cache (unreadable: weighed again)")


@dataclass(frozen=True)
class Figures:
    """What one build of a stage costs, from the compiler's own plan."""

    cpu_layers: int
    weight_bytes: int | None
    internal_bytes: int | None

    @property
    def device_bytes(self) -> int | None:
        if self.weight_bytes is None or self.internal_bytes is None:
            return None
        return self.weight_bytes + self.internal_bytes

    @classmethod
    def of(cls, cpu_ops: Sequence[str], plan: CompilerPlan | None) -> Figures:
        return cls(cpu_layers=len(cpu_ops), weight_bytes=None if plan is None else plan.weight_bytes,
                   internal_bytes=None if plan is None else plan.internal_bytes)

    def to_json(self) -> JsonObject:
        return {"cpu_layers": self.cpu_layers, "weight_bytes": self.weight_bytes,
                "internal_bytes": self.internal_bytes}

    @classmethod
    def from_json(cls, d: JsonMap) -> Figures:
        def num(v: object) -> int | None:
            if v is None:
                return None
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"not a byte count: {v!r}")
            return v
        n = d["cpu_layers"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"not a layer count: {n!r}")
        return cls(cpu_layers=n, weight_bytes=num(d.get("weight_bytes")), internal_bytes=num(d.get("internal_bytes")))

    def describe(self) -> str:
        mib = 1 << 20
        w, i = self.weight_bytes, self.internal_bytes
        mem = ("no memory figures" if w is None or i is None else
               f"{(w + i) / mib:.2f} MiB device memory ({w / mib:.2f} weight + {i / mib:.2f} internal)")
        return f"{mem}, {self.cpu_layers} CPU layer{'s' if self.cpu_layers != 1 else ''}"


@dataclass(frozen=True)
class Verdict:
    """Whether the weighed rewrites a stage matched are kept, and the two builds' figures behind it."""

    rewrites: tuple[str, ...]  # the weighed rewrites the stage matched (sorted): kept or left out together
    kept: bool
    with_rewrites: Figures | None  # None: no rewrite to weigh matched (nothing was built twice)
    without: Figures | None  # None: the build without them failed (or was not made)
    why: str

    def to_json(self) -> JsonObject:
        return {"rewrites": list(self.rewrites), "kept": self.kept,
                "with": None if self.with_rewrites is None else self.with_rewrites.to_json(),
                "without": None if self.without is None else self.without.to_json(), "why": self.why}

    @classmethod
    def from_json(cls, d: JsonMap) -> Verdict:
        rewrites = d["rewrites"]
        if not isinstance(rewrites, list) or not all(isinstance(x, str) for x in rewrites):
            raise ValueError("rewrites: not a list of names")
        if not isinstance(d["kept"], bool) or not isinstance(d["why"], str):
            raise ValueError("kept / why: wrong type")
        w, wo = d.get("with"), d.get("without")
        return cls(rewrites=tuple(rewrites), kept=d["kept"],
                   with_rewrites=None if w is None else Figures.from_json(w),
                   without=None if wo is None else Figures.from_json(wo), why=d["why"])


def judge(rewrites: Sequence[str], with_rewrites: Figures, without: Figures | None,
          failed_without: str | None = None) -> Verdict:
    """Keep ``rewrites`` (weighed, matched in one stage) or not, from the compiler's figures of the stage
    built with them and ``without`` them: fewer CPU layers first, then less device memory (weight +
    internal); equal, the build with fewer rewrites.  Without figures to compare, or when the build
    without them failed (``failed_without``), they are kept."""
    names = tuple(sorted(rewrites))

    def verdict(kept: bool, why: str) -> Verdict:
        return Verdict(names, kept, with_rewrites, without, why)

    if without is None:
        return verdict(True, f"kept: the build without {', '.join(names)} failed"
                       + (f" ({failed_without})" if failed_without else ""))
    if with_rewrites.cpu_layers != without.cpu_layers:
        fewer = with_rewrites.cpu_layers < without.cpu_layers
        return verdict(fewer, f"{'kept' if fewer else 'left out'}: {with_rewrites.cpu_layers} CPU layers with, "
                              f"{without.cpu_layers} without")
    a, b = with_rewrites.device_bytes, without.device_bytes
    if a is None or b is None:
        return verdict(True, "kept: a build printed no memory figures to weigh them by")
    mib = 1 << 20
    layers = f"{without.cpu_layers} CPU layers either way"
    if a == b:
        return verdict(False, f"left out: the same device memory with and without ({a / mib:.2f} MiB), {layers}")
    diff = f"{abs(a - b) / mib:.2f} MiB" if abs(a - b) >= mib // 100 else f"{abs(a - b) / 1024:.1f} KiB"
    return verdict(a < b, f"{'kept' if a < b else 'left out'}: {diff} {'less' if a < b else 'more'} device memory "
                          f"with ({a / mib:.2f} against {b / mib:.2f} MiB), {layers}")


def load_graph(path: Path) -> onnx.ModelProto | None:
    """The stage at ``path`` without its external data (``None``: it does not load; its build says why)."""
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError: the build of the stage reports it
        return None


def verdict_key(anatomy: str, toolkit: str, target: str, config: JsonMap, candidates: Sequence[str],
                skip: Sequence[str], extra: JsonMap | None = None, rules: Sequence[str] = ()) -> str:
    """The cache key of one weighing: the stage's anatomy, the toolkit, target and build config (and a
    quantized build's ``extra``), the rewrites that may be weighed, those the user left out and the
    rewrite table (``rules``, with the prepare version): a change to any of them weighs again."""
    from rkpart.compile.cache import normalise_config

    blob = json.dumps({"v": WEIGH_VERSION, "anatomy": anatomy, "toolkit": toolkit, "target": target,
                       "config": normalise_config(config), "extra": dict(extra or {}),
                       "candidates": sorted(candidates), "skip": sorted(skip), "rules": list(rules)},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


class VerdictStore:
    """Verdicts by :func:`verdict_key` in the plan's ``rknn/weigh/`` and, when there is one, the shared
    build cache's ``weigh/`` (read first from the plan, written to both)."""

    def __init__(self, roots: Sequence[Path]) -> None:
        self.dirs = [r / WEIGH_DIR for r in roots]

    def get(self, key: str) -> Verdict | None:
        for d in self.dirs:
            path = d / f"{key}.json"
            try:
                if not path.is_file():
                    continue
                raw = VERDICT_KIND.load(path, root=d)
                if not isinstance(raw, Mapping) or raw.get("version") != WEIGH_VERSION or raw.get("key") != key:
                    continue
                v = Verdict.from_json(raw["verdict"])
            except (OSError, ValueError, KeyError, TypeError, UserError):
                continue  # unreadable: weighed again
            if d != self.dirs[0]:
                self._write(self.dirs[0], key, v)
                # a use: `rkpart cache prune --older-than` keeps the verdicts still served
                with contextlib.suppress(OSError):
                    os.utime(path)
            return v
        return None

    def put(self, key: str, verdict: Verdict) -> None:
        for d in self.dirs:
            self._write(d, key, verdict)

    @staticmethod
    def _write(d: Path, key: str, verdict: Verdict) -> None:
        blob = json.dumps({"version": WEIGH_VERSION, "key": key, "verdict": verdict.to_json()},
                          indent=2, sort_keys=True) + "\n"
        # a cache we cannot write is not fatal: the verdict is weighed again next time
        with contextlib.suppress(OSError):
            d.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(d / f"{key}.json", blob.encode())


__all__ = ["WEIGHED_OUT", "WEIGH_DIR", "WEIGH_MIN_BYTES", "WEIGH_VERSION", "Figures", "Verdict", "VerdictStore",
           "judge",
           "load_graph", "verdict_key"]
