"""JSON Schema of ``plan.json`` (documented in docs/plan.md) and its validation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema

from rkpart.errors import SpecError

_TENSOR = {
    "type": "object",
    "required": ["name", "dtype", "shape"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "dtype": {"type": "string", "minLength": 1},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    },
}
_ARTIFACT = {
    "type": "object",
    "required": ["kind", "file", "toolkit", "target", "config_hash", "sha256", "size_bytes"],
    "properties": {
        "kind": {"type": "string"},
        "file": {"type": "string", "minLength": 1},
        "toolkit": {"type": "string"},
        "target": {"type": "string"},
        "config_hash": {"type": "string"},
        "sha256": {"type": "string"},
        "size_bytes": {"type": "integer", "minimum": 0},
        "cpu_ops": {"type": "array", "items": {"type": "string"}},
        "fallback_reason": {"type": ["string", "null"]},
    },
}
_STAGE = {
    "type": "object",
    "required": ["id", "device", "file", "inputs", "outputs", "region", "weight_bytes", "io_bytes", "sha256"],
    "properties": {
        "id": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"},
        "device": {"enum": ["npu", "host"]},
        "file": {"type": "string", "minLength": 1},
        "inputs": {"type": "array", "items": {"type": "string"}},
        "outputs": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "block": {"type": ["integer", "null"], "minimum": 0},
        "blocks": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "region": {"type": "string"},
        "kind": {"type": "string"},
        "weight_bytes": {"type": "integer", "minimum": 0},
        "io_bytes": {"type": "integer", "minimum": 0},
        "sha256": {"type": "string"},
        "num_nodes": {"type": "integer", "minimum": 0},
        "artifacts": {"type": "array", "items": _ARTIFACT},
        "failures": {"type": "array", "items": {"type": "object"}},
    },
}
PLAN_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "rkpart plan",
    "type": "object",
    "required": ["format", "version", "model", "strategy", "inputs", "outputs", "tensors", "stages"],
    "properties": {
        "format": {"const": "rkpart-plan"},
        "version": {"const": 1},
        "model": {"type": "object", "required": ["file", "sha256"]},
        "strategy": {"type": "object", "required": ["name"]},
        "inputs": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "outputs": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "tensors": {"type": "object", "additionalProperties": _TENSOR},
        "blocks": {"type": "array", "items": {"type": "object"}},
        "stages": {"type": "array", "items": _STAGE, "minItems": 1},
        "extra": {"type": "object"},
    },
}


def validate_plan_json(data: Any) -> None:
    """Schema check plus cross-references; raises :class:`SpecError` naming the first problem."""
    if not isinstance(data, Mapping):
        raise SpecError("plan is not a JSON object")
    v = jsonschema.Draft202012Validator(PLAN_SCHEMA)
    errs = sorted(v.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errs:
        e = errs[0]
        loc = "/".join(str(x) for x in e.absolute_path) or "(top level)"
        raise SpecError(f"invalid plan: at {loc}: {e.message}")
    tensors = data["tensors"]
    have = set(data["inputs"])
    ids: set[str] = set()
    for s in data["stages"]:
        if s["id"] in ids:
            raise SpecError(f"invalid plan: stage id {s['id']!r} is used twice")
        ids.add(s["id"])
        for t in [*s["inputs"], *s["outputs"]]:
            if t not in tensors:
                raise SpecError(f"invalid plan: stage {s['id']} names tensor {t!r} missing from 'tensors'")
        for t in s["inputs"]:
            if t not in have:
                raise SpecError(f"invalid plan: stage {s['id']} reads {t!r} before any stage produces it")
        have.update(s["outputs"])
    for t in data["outputs"]:
        if t not in have:
            raise SpecError(f"invalid plan: model output {t!r} is produced by no stage")
