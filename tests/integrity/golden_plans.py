"""Golden plans: the sha256 of every file of a fixed set of plans, recorded from a known-good tree.

``tests/integrity/test_golden_plans.py`` partitions the same set and compares, so a refactoring
that changes what rkpart writes fails.  Regenerating the record is a deliberate act::

    PYTHONPATH=. python -m tests.integrity.golden_plans      # rewrites golden_plans.json

The set (:data:`CASES`): the bundled example (every built-in strategy), and a fixed part of the
family sweep -- the onnx-built Anima at float16, tiny diffusers exports
(:mod:`tests.models.diffusers_families`) of both exporters and the hand-written families
(:mod:`tests.models.structural`, ``moe``, ``av_dit``), named and anonymised
(:func:`rkpart.plan.anonymize.anonymize_file`), ``split`` and ``fused``.  A model that
needs a torch export (:attr:`Model.export`) comes from the sweep's export cache and is copied
under a fixed name without the exporter's stack traces (:func:`_copy`), so neither the cache's
file name nor the checkout the export was made from reaches a plan.

The model's absolute path (``model.path`` in plan.json) depends on where the tree and the work
folder are; it is replaced by ``<MODEL>`` before plan.json is hashed.  Every other byte counts.
Each case also records the sha256 of the model it partitions (:data:`INPUT`): an export depends
on the torch and diffusers versions, and a record made from other inputs says nothing.
Placements learned by earlier builds change plans (``rkpart.grouping.learned``), so every plan is
made with an empty private ``$RKPART_CACHE_DIR``.

An export's bytes also depend on the machine: the TorchScript exports of flux and lumina2 made
here differ from those of the machine the record was first made on, with the same torch 2.13.0,
diffusers 0.42.1 and onnx 1.23.2 (not the CPU kernels, ``ATEN_CPU_CAPABILITY`` avx2/avx512 give
the same bytes; not the thread count; not ml_dtypes 0.6 / 0.7).  Of each plan's 33 files only
the host prologue (where the exporter folded the position embedding) and plan.json (its sha256)
differ; every block stage is the same.  So an export case may hold
variants, ``<case>@<16 hex digits of its input's sha256>``, each the exact record of the plans
of that export, added by a tree whose plans of the first export matched (``--add-variants``
never replaces an entry)::

    PYTHONPATH=. python -m tests.integrity.golden_plans --add-variants

A change meant to change some plans re-records just those (``--update CASE ...``); an export
case's variants from other machines go with it (they were made by the tree before the change),
and on a machine whose export no entry holds, the test skips that case, saying so.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RECORD = Path(__file__).with_name("golden_plans.json")
#: a case's record entry for the sha256 of the model it partitions
INPUT = "<input model>"


@dataclass(frozen=True)
class Model:
    """A model of the fixed set: ``make(work)`` returns its file (writing it under ``work`` if need be)."""

    name: str
    make: Callable[[Path], Path]
    export: bool = False  # needs a torch export (the test's ``export`` tier)


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    strategy: str
    options: Mapping[str, Any] = field(default_factory=dict)


def _example(work: Path) -> Path:
    from rkpart.cli_args import bundled_example

    return bundled_example()


def _anima_fp16(work: Path) -> Path:
    from tests.models.anima import AnimaConfig, build_anima_onnx

    return build_anima_onnx(AnimaConfig.tiny(num_blocks=3, dtype="float16"), work / "anima-fp16.onnx")


def _copy(src: Path, dst: Path) -> Path:
    """The export ``src`` as ``dst``, inline, without the exporter's stack traces.

    The cache's file name stays out of plan.json, and dynamo's ``pkg.torch.onnx.stack_trace``
    (the absolute path and line of the test module and the venv that exported it, copied into
    stage nodes) out of the bytes: the same export made from another checkout hashes the same.
    """
    import onnx

    model = onnx.load(str(src))  # external data (dynamo) read in: written inline below
    graphs = [model.graph]
    while graphs:
        g = graphs.pop()
        for node in g.node:
            keep = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
            del node.metadata_props[:]
            node.metadata_props.extend(keep)
            graphs += [a.g for a in node.attribute if a.HasField("g")] + [x for a in node.attribute for x in a.graphs]
    dst.write_bytes(model.SerializeToString(deterministic=True))
    return dst


def _family(name: str, exporter: str) -> Callable[[Path], Path]:
    def make(work: Path) -> Path:
        from tests.models.diffusers_families import cached_export

        return _copy(cached_export(name, exporter), work / f"{name}-{exporter[:2]}.onnx")
    return make


def _layout(layout: str, exporter: str) -> Callable[[Path], Path]:
    def make(work: Path) -> Path:
        from tests.models.structural import cached_export

        return _copy(cached_export(layout, exporter), work / f"{layout}-{exporter[:2]}.onnx")
    return make


def _moe(work: Path) -> Path:
    from tests.models.moe import cached_export

    return _copy(cached_export("dynamo"), work / "moe-dy.onnx")


def _av_dit(work: Path) -> Path:
    from tests.models.av_dit import cached_export

    return _copy(cached_export("torchscript"), work / "av_dit-to.onnx")


_NAMED = (
    Model("example", _example),
    Model("anima-fp16", _anima_fp16),
    Model("flux-to", _family("flux", "torchscript"), export=True),  # MMDiT dual blocks, then parallel single ones
    Model("flux-dy", _family("flux", "dynamo"), export=True),  # the same at dynamo's default opset 20
    Model("wan-dy", _family("wan", "dynamo"), export=True),  # cross-attention, RoPE by ScatterND
    Model("lumina2-to", _family("lumina2", "torchscript"), export=True),  # caption refiner, then joint blocks
    Model("hunyuanvideo-dy", _family("hunyuanvideo", "dynamo"), export=True),  # text blocks first
    Model("interleaved-to", _layout("interleaved", "torchscript"), export=True),  # refiners alternating in op order
    Model("moe-dy", _moe, export=True),  # routing ops the capability keeps on the host
    Model("av_dit-to", _av_dit, export=True),  # two streams attending each other
)
#: anonymised copies (every node and tensor name opaque, no metadata): blocks from structure alone
_ANON = ("example", "anima-fp16", "flux-to", "wan-dy", "lumina2-to", "interleaved-to")


def _anonymised(base: Model) -> Model:
    def make(work: Path) -> Path:
        from rkpart.plan.anonymize import anonymize_file

        return anonymize_file(base.make(work), work / f"{base.name}-anon.onnx")
    return Model(f"{base.name}-anon", make, base.export)


MODELS: dict[str, Model] = {m.name: m for m in _NAMED}
MODELS.update({f"{n}-anon": _anonymised(MODELS[n]) for n in _ANON})

#: the bundled example's cases keep the names of the first record
CASES: tuple[Case, ...] = (
    Case("split", "example", "split"),
    Case("split-adaln-npu", "example", "split", {"adaln": "npu"}),
    Case("fused", "example", "fused"),
    Case("fused-x2", "example", "fused", {"blocks_per_stage": 2}),
    Case("generic", "example", "generic"),
    Case("auto", "example", "auto"),
    Case("anima-fp16/generic", "anima-fp16", "generic"),
    Case("anima-fp16/fused-x2", "anima-fp16", "fused", {"blocks_per_stage": 2}),
    Case("flux-to/split-adaln-npu", "flux-to", "split", {"adaln": "npu"}),
    Case("flux-to/auto", "flux-to", "auto"),
    *(Case(f"{m}/{s}", m, s) for m in MODELS if m != "example" for s in ("split", "fused")),
)


@contextmanager
def _private_cache() -> Iterator[None]:
    """An empty ``$RKPART_CACHE_DIR`` while plans are made: no placement learned by a build reaches them."""
    old = os.environ.get("RKPART_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="rkpart-golden-cache-") as tmp:
        os.environ["RKPART_CACHE_DIR"] = tmp
        try:
            yield
        finally:
            if old is None:
                del os.environ["RKPART_CACHE_DIR"]
            else:
                os.environ["RKPART_CACHE_DIR"] = old


def digest(folder: Path, model: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` by relative path (plan.json with the model path masked)."""
    out: dict[str, str] = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = f.relative_to(folder).as_posix()
        data = f.read_bytes()
        if rel == "plan.json":
            data = data.replace(json.dumps(str(model.resolve())).encode(), b'"<MODEL>"')
        out[rel] = hashlib.sha256(data).hexdigest()
    return out


class Golden:
    """Makes each model of :data:`MODELS` once under ``root`` and digests the plans of cases over them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.models: dict[str, Path] = {}

    def model(self, name: str) -> Path:
        if name not in self.models:
            work = self.root / "models"
            work.mkdir(parents=True, exist_ok=True)
            self.models[name] = MODELS[name].make(work)
        return self.models[name]

    def case(self, case: Case, model: Path | None = None) -> dict[str, str]:
        """The digest of ``case``'s plan (of ``model``, by default the case's own), with :data:`INPUT`."""
        from rkpart.pipeline import partition

        model = model or self.model(case.model)
        folder = self.root / "plans" / case.name
        with _private_cache():
            partition(model, folder, case.strategy, **case.options)
        return {INPUT: hashlib.sha256(model.read_bytes()).hexdigest(), **digest(folder, model)}


def compute(root: Path, cases: tuple[Case, ...] = CASES) -> dict[str, dict[str, str]]:
    """Partition every case under ``root`` and digest each plan folder."""
    golden = Golden(root)
    return {c.name: golden.case(c) for c in cases}


def variant_key(case: str, input_sha256: str) -> str:
    """The record key of ``case``'s plans of the export whose sha256 is ``input_sha256``."""
    return f"{case}@{input_sha256[:16]}"


def entry_for(record: Mapping[str, Mapping[str, str]], case: str, input_sha256: str) -> Mapping[str, str] | None:
    """The recorded digest of ``case`` over the model ``input_sha256``: its entry or a variant's."""
    for e in (record.get(case), record.get(variant_key(case, input_sha256))):
        if e is not None and e.get(INPUT) == input_sha256:
            return e
    return None


def add_variants(root: Path, record: dict[str, dict[str, str]]) -> list[str]:
    """Record this machine's export cases whose input no entry has; returns the keys added."""
    golden = Golden(root)
    added = []
    for c in CASES:
        if not MODELS[c.model].export:
            continue
        got = golden.case(c)
        if entry_for(record, c.name, got[INPUT]) is None:
            record[variant_key(c.name, got[INPUT])] = got
            added.append(variant_key(c.name, got[INPUT]))
    return added


def main(argv: list[str] | None = None) -> int:
    """Rewrite the record; ``--out FILE`` writes it there instead (to compare trees: run from each);
    ``--add-variants`` adds this machine's exports' plans to it (see the module docstring)."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--update"] and len(args) > 1:  # cases whose plans a change meant to change
        record = json.loads(RECORD.read_text())
        with tempfile.TemporaryDirectory() as tmp:
            golden = Golden(Path(tmp))
            for name in args[1:]:
                case = next(c for c in CASES if c.name == name)
                for k in [k for k in record if k.startswith(f"{name}@")]:
                    del record[k]  # other machines' exports: made by the tree before the change
                record[name] = golden.case(case)
        RECORD.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        print(f"re-recorded {', '.join(args[1:])} in {RECORD}")
        return 0
    if args == ["--add-variants"]:
        record = json.loads(RECORD.read_text())
        with tempfile.TemporaryDirectory() as tmp:
            added = add_variants(Path(tmp), record)
        RECORD.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        print(f"added {len(added)} variants to {RECORD}: {', '.join(added) or 'none'}")
        return 0
    out = Path(args[1]) if args[:1] == ["--out"] and len(args) == 2 else RECORD
    with tempfile.TemporaryDirectory() as tmp:
        record = compute(Path(tmp))
    out.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out} ({sum(map(len, record.values()))} files in {len(record)} plans)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
