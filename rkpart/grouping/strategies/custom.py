"""``custom``: stages named in a user spec (YAML or JSON); the rest by another strategy.

Schema (documented in ``docs/custom-spec.md``)::

    version: 1
    rest: split            # split | fused | host: how ops no stage names are partitioned
    rest_options: {adaln: host}
    stages:
      - id: b00-b01        # whole blocks in one stage
        device: npu
        blocks: [0, 1]
      - id: b02.attn-ffn   # chosen regions of one block, with their AdaLN and residual
        device: npu
        block: 2
        regions: [attn, ffn]
        include: [adaln, residual]
      - id: tail           # explicit cut: everything between these tensors
        device: npu
        cut: {inputs: [a], outputs: [b]}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from rkpart.discovery.structure import Discovery
from rkpart.errors import SpecError, UserError
from rkpart.grouping.strategies.base import (
    GroupBuilder,
    Partition,
    Strategy,
    check_strategy_options,
    option,
    propose_with,
)
from rkpart.grouping.strategies.fused import FusedStrategy
from rkpart.grouping.strategies.split import SplitStrategy
from rkpart.io import loads_json, loads_yaml
from rkpart.ir import ModelGraph
from rkpart.readers import FileKind
from rkpart.types import JsonMap, JsonObject

_STAGE_ID = {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$",
             "description": "Unique stage id (letters, digits, '_', '.', '-'; at most 64 characters)."}
SPEC_SCHEMA: JsonObject = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "rkpart custom partition spec",
    "description": "Stages for --strategy custom (docs/custom-spec.md).",
    "type": "object",
    "additionalProperties": False,
    "required": ["version", "stages"],
    "properties": {
        "version": {"const": 1, "description": "Spec format version."},
        "rest": {"enum": ["split", "fused", "host"], "description":
                 "How ops no stage names are partitioned: by the split or fused strategy, or all on the host. "
                 "Default: split."},
        "rest_options": {"type": "object", "description":
                         "Options for the 'rest' strategy, e.g. {adaln: npu} or {blocks_per_stage: 2}."},
        "stages": {
            "type": "array",
            "minItems": 1,
            "description": "Stages named by the user; each takes whole blocks, regions of one block, or the "
                           "ops between cut tensors.",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["id"],
                "properties": {
                    "id": _STAGE_ID,
                    "device": {"enum": ["npu", "host"], "description": "Where the stage runs. Default: npu."},
                    "blocks": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1,
                               "description": "Whole blocks (by index, see `rkpart inspect`) in one stage."},
                    "block": {"type": "integer", "minimum": 0,
                              "description": "The block whose 'regions' this stage takes."},
                    "regions": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                                "description": "Region names of 'block' (attn, xattn, jattn, ffn, ...)."},
                    "include": {
                        "type": "array",
                        "items": {"enum": ["adaln", "residual", "mod"]},
                        "description": "With 'regions': also take each region's AdaLN ('adaln'), gate and "
                                       "residual add ('residual'), modulation layers ('mod').",
                    },
                    "cut": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["inputs", "outputs"],
                        "description": "Explicit cut: every op between these tensors (names as in the model).",
                        "properties": {
                            "inputs": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                            "outputs": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                        },
                    },
                },
                "oneOf": [
                    {"required": ["blocks"], "not": {"anyOf": [{"required": ["block"]}, {"required": ["cut"]}]}},
                    {"required": ["block", "regions"], "not": {"anyOf": [{"required": ["blocks"]},
                                                                         {"required": ["cut"]}]}},
                    {"required": ["cut"], "not": {"anyOf": [{"required": ["blocks"]}, {"required": ["block"]}]}},
                ],
            },
        },
    },
}


#: a spec names a few dozen stages; anything far larger is a mistake or a YAML alias bomb
MAX_SPEC_ITEMS = 100_000
MAX_SPEC_BYTES = 4 << 20


def _count_items(data: object, limit: int) -> int:
    """Count nodes of a parsed spec, stopping at ``limit`` (YAML aliases share objects, so a
    tiny file can expand to billions of nodes for anything that walks it)."""
    n = 0
    stack = [data]
    while stack and n <= limit:
        x = stack.pop()
        n += 1
        if isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return n


#: ``partition -s custom --spec FILE`` (YAML, or JSON by its suffix)
SPEC_KIND = FileKind("custom spec", "bytes", MAX_SPEC_BYTES, SpecError, doc="`partition -s custom --spec`")


def load_spec(path: str | Path) -> JsonObject:
    """Read and schema-check a custom spec; raises :class:`SpecError` with the offending path."""
    p = Path(path)
    kind = "JSON" if p.suffix == ".json" else "YAML"
    raw = SPEC_KIND.read(p)
    try:
        text = raw.decode()
    except UnicodeDecodeError as e:
        raise SpecError(f"cannot read custom spec {p}: {e}") from None
    if kind == "JSON":
        data = loads_json(text, what=f"custom spec {p}", error=SpecError)
    else:
        data = loads_yaml(text, what=f"custom spec {p}", error=SpecError)
    validate_spec(data, str(p))
    return data  # type: ignore[no-any-return,unused-ignore]


def validate_spec(data: Any, where: str = "custom spec") -> None:
    """Check ``data`` against :data:`SPEC_SCHEMA` and for duplicate stage ids."""
    if _count_items(data, MAX_SPEC_ITEMS) > MAX_SPEC_ITEMS:
        raise SpecError(f"{where}: more than {MAX_SPEC_ITEMS} items (YAML aliases expanding?); refusing it")
    v = jsonschema.Draft202012Validator(SPEC_SCHEMA)
    errors = sorted(v.iter_errors(data), key=lambda e: [str(x) for x in e.absolute_path])
    if errors:
        e = errors[0]
        loc = "/".join(str(x) for x in e.absolute_path) or "(top level)"
        msg = e.message if e.validator != "oneOf" else (
            "a stage needs exactly one of: 'blocks', 'block' + 'regions', or 'cut'")
        if len(msg) > 200:
            msg = msg[:200] + "..."
        raise SpecError(f"{where}: at {loc}: {msg}")
    ids = [s["id"] for s in data["stages"]]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise SpecError(f"{where}: stage id {dup[0]!r} is used twice")


def spec_schema_json() -> str:
    """:data:`SPEC_SCHEMA` as the text of ``docs/custom-spec.schema.json``."""
    return json.dumps(SPEC_SCHEMA, indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class CustomOptions:
    """``spec``: a spec file (YAML/JSON), or the spec itself as a mapping (validated when used)."""

    spec: str | Path | JsonMap

    @classmethod
    def from_mapping(cls, options: JsonMap) -> CustomOptions:
        spec = options.get("spec")
        if spec is None:
            raise SpecError("strategy custom needs --spec FILE")
        return cls(spec)


class CustomStrategy(Strategy[CustomOptions]):
    name = "custom"
    accepts = ("spec",)
    requires = ("spec",)
    summary = "stages named in a YAML/JSON spec (blocks, regions or cut tensors); the rest by another strategy"
    Options = CustomOptions

    def propose(self, mg: ModelGraph, disc: Discovery | None, opts: CustomOptions) -> Partition:
        spec = opts.spec
        data: Any = load_spec(spec) if isinstance(spec, (str, Path)) else spec
        if not isinstance(spec, (str, Path)):
            validate_spec(data)
        rest = option(data, "rest", "split", ("split", "fused", "host"))
        gb = GroupBuilder()
        blocks = {b.index: b for b in (disc.blocks if disc else ())}
        for s in data["stages"]:
            device = s.get("device", "npu")
            if "blocks" in s:
                missing = [i for i in s["blocks"] if i not in blocks]
                if missing:
                    raise SpecError(f"stage {s['id']}: block {missing[0]} does not exist "
                                    f"(model has blocks 0..{len(blocks) - 1})")
                ops: set[int] = set()
                for i in s["blocks"]:
                    ops |= blocks[i].ops
                gb.add(s["id"], ops, device=device, region="block", kind="custom-blocks",
                       block=s["blocks"][0], blocks=tuple(s["blocks"]))
            elif "block" in s:
                b = blocks.get(s["block"])
                if b is None:
                    raise SpecError(f"stage {s['id']}: block {s['block']} does not exist "
                                    f"(model has blocks 0..{len(blocks) - 1})")
                names = {r.name: r for r in b.regions}
                include = set(s.get("include", []))
                ops = set()
                for rn in s["regions"]:
                    if rn not in names:
                        raise SpecError(f"stage {s['id']}: block {b.index} has no region {rn!r} "
                                        f"(regions: {', '.join(names)})")
                    r = names[rn]
                    ops |= r.core
                    if "adaln" in include:
                        ops |= r.pre
                    if "residual" in include:
                        ops |= r.gate | r.adds
                    if "mod" in include:
                        ops |= r.mod
                if "mod" in include:
                    ops |= b.mod
                gb.add(s["id"], ops, device=device, region="+".join(s["regions"]), kind="custom-regions",
                       block=b.index, blocks=(b.index,))
            else:
                ops = _cut(mg, s["id"], s["cut"]["inputs"], s["cut"]["outputs"])
                gb.add(s["id"], ops, device=device, region="cut", kind="custom-cut")
        if rest == "host":
            gb.add_host_rest(mg, disc, close=False)
        else:
            try:
                rest_strategy = _REST[rest]()
                rest_options = dict(data.get("rest_options", {}))
                check_strategy_options(rest_strategy, rest_options)
                part = propose_with(rest_strategy, mg, disc, rest_options)
            except SpecError:
                raise
            except UserError as e:
                # e.g. rest_options: {adaln: bogus}: the spec is what needs fixing
                raise SpecError(f"custom spec: rest_options for {rest}: {e}") from None
            taken = {s["id"] for s in data["stages"]}
            for g in part.groups:
                if g.id in taken:
                    raise SpecError(f"custom stage id {g.id!r} collides with a {rest} stage; rename it")
                gb.add(g.id, g.ops, device=g.device, region=g.region, kind=g.kind, block=g.block, blocks=g.blocks)
        # the spec's own stages are the user's: a cycle through one of them is the spec's to fix
        ids = tuple(s["id"] for s in data["stages"])
        return gb.build(self.name, {"rest": rest, "stages": list(ids)}, mg=mg, pinned=ids)


#: the strategies a spec's ``rest`` names (the schema's enum, ``host`` aside)
_REST: dict[str, type[Strategy]] = {"split": SplitStrategy, "fused": FusedStrategy}


def _cut(mg: ModelGraph, sid: str, inputs: list[str], outputs: list[str]) -> set[int]:
    for t in [*inputs, *outputs]:
        if t not in mg.tensor_types:
            raise SpecError(f"stage {sid}: cut tensor {t!r} is not in the model")
    for t in outputs:
        p = mg.producer.get(t)
        if p is None or p in mg.const_ops:
            raise SpecError(f"stage {sid}: cut output {t!r} is not computed by an op")
    ops = mg.between(inputs, outputs)
    if not ops:
        raise SpecError(f"stage {sid}: no op lies between cut inputs and outputs")
    return ops
