"""JSON Schema of ``plan.json`` and its validation.

:data:`PLAN_SCHEMA` is the source of truth: ``docs/plan.schema.json`` is generated from it by
``python -m rkpart.plan.schema_docs docs`` (which also writes
``docs/custom-spec.schema.json``; a test keeps both equal to the code), and ``docs/plan.md``
explains it field by field.  :func:`validate_plan_json` adds the checks a JSON Schema cannot
express (cross-references, execution order, dtypes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import jsonschema
import numpy as np

from rkpart.errors import SpecError
from rkpart.io import bounded_integers
from rkpart.types import DEVICES, JsonObject

_HEX64 = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
_REL_PATH = {
    "type": "string",
    "minLength": 1,
    # relative, forward slashes, no "..": load_plan also resolves symlinks (check_inside)
    "pattern": r"^(?!/)(?![A-Za-z]:)(?!.*(^|/)\.\.(/|$))[^\\]+$",
    "description": "Path relative to the plan folder; must stay inside it (no '..', not absolute, "
                   "no symlink leading out).",
}
_TENSOR = {
    "type": "object",
    "description": "A boundary tensor: model input/output or a tensor passed between stages.",
    "required": ["name", "dtype", "shape"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1, "description": "Tensor name (equal to its key in 'tensors')."},
        "dtype": {"type": "string", "minLength": 1, "description": "numpy dtype name, e.g. 'float32', 'int64'."},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0},
                  "description": "Static shape; every dimension is known."},
    },
}
_COUNT_OR_NULL = {"type": ["integer", "null"], "minimum": 0}
_COUNTS = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}
_COMPILER_PLAN = {
    "type": "object",
    "description": "What the toolkit's verbose build log says it planned: memory statistics and the layer table "
                   "summarised. A figure the log does not print is null, never 0.",
    "required": ["version", "weight_bytes", "internal_bytes", "layers", "cycles_ddr", "cycles_npu", "cycles_total",
                 "rw_bytes"],
    "additionalProperties": False,
    "properties": {
        "version": {"const": 1, "description": "Version of this record."},
        "weight_bytes": {**_COUNT_OR_NULL, "description": "'Total Weight Memory Size' in bytes."},
        "internal_bytes": {**_COUNT_OR_NULL, "description": "'Total Internal Memory Size' in bytes."},
        "layers": {"type": "integer", "minimum": 0, "description": "Rows of the layer table (I/O operators included)."},
        "cycles_ddr": {**_COUNT_OR_NULL, "description": "Sum of the DDR cycles column."},
        "cycles_npu": {**_COUNT_OR_NULL, "description": "Sum of the NPU cycles column."},
        "cycles_total": {**_COUNT_OR_NULL, "description": "Sum of the Total cycles column (per row max(DDR, NPU))."},
        "rw_bytes": {**_COUNT_OR_NULL, "description": "Sum of the RW(KB) column, in bytes."},
        "by_op": {**_COUNTS, "description": "Layers per op type."},
        "by_dtype": {**_COUNTS, "description": "Layers per data type."},
        "by_target": {**_COUNTS, "description": "Layers per target (NPU, CPU), input/output operators excluded."},
        "uncycled_ops": {"type": "array", "items": {"type": "string"},
                         "description": "Op types whose every layer shows 0/0/0 cycles (no estimate)."},
        "multicore_cycles": {**_COUNT_OR_NULL,
                             "description": "Total cycles of the layers the NPU splits across cores (Conv, Add, Mul "
                                            "and their fused forms)."},
        "layers_file": {"oneOf": [{"type": "null"}, _REL_PATH],
                        "description": "The per-layer rows, relative to the plan folder."},
    },
}
_ARTIFACT = {
    "type": "object",
    "description": "A compiled form of the stage, added by 'rkpart compile'.",
    "required": ["kind", "file", "toolkit", "target", "config_hash", "sha256", "size_bytes"],
    "properties": {
        "kind": {"type": "string", "description": "Artifact type, e.g. 'rknn'."},
        "file": _REL_PATH,
        "toolkit": {"type": "string", "description": "rknn-toolkit2 version that built it."},
        "target": {"type": "string", "description": "target_platform, e.g. 'rk3588'."},
        "config_hash": {"type": "string", "description": "Hash of the build configuration (cache key)."},
        "sha256": {"type": "string", "description": "sha256 of the artifact file."},
        "size_bytes": {"type": "integer", "minimum": 0, "description": "Size of the artifact file."},
        "cpu_ops": {"type": "array", "items": {"type": "string"},
                    "description": "Ops the toolkit placed on the CPU instead of the NPU."},
        "fallback_reason": {"type": ["string", "null"],
                            "description": "Set when a fallback toolkit built it: why the first one failed."},
        "compiler": {"oneOf": [{"type": "null"}, _COMPILER_PLAN],
                     "description": "The compiler's own plan of the build, read from its verbose log "
                                    "(docs/compile.md); null when the log was not read."},
        "precision": {"enum": ["fp16", "int8", "hybrid"],
                      "description": "How it was built (absent: fp16); int8 is w8a8, hybrid int8 with some "
                                     "layers in float16."},
        "quantized_algorithm": {"type": ["string", "null"], "description": "int8 / hybrid: quantized_algorithm."},
        "calibration_sha256": {"type": ["string", "null"],
                               "description": "int8 / hybrid: sha256 of the calibration manifest it was built from."},
        "calibration_dataset": {"type": ["string", "null"],
                                "description": "int8 / hybrid: the stage's dataset.txt, relative to the plan folder "
                                               "(rknn/calibration/...)."},
        "float16_layers": {"type": "array", "items": {"type": "string"},
                           "description": "hybrid: the layers (tensor names) kept in float16."},
    },
}
_STAGE = {
    "type": "object",
    "description": "One standalone ONNX subgraph, run on one device.",
    "required": ["id", "device", "file", "inputs", "outputs", "region", "weight_bytes", "io_bytes", "sha256"],
    "properties": {
        "id": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$",
               "description": "Unique stage id, e.g. 'b03.attn', 'b03.xattn.pre', 'prologue'."},
        "device": {"enum": list(DEVICES), "description": "'npu': compiled with rknn-toolkit2; "
                   "'host': run by ONNX Runtime on the CPU."},
        "file": {**_REL_PATH, "description": "The stage's ONNX file, relative to the plan folder "
                 "(weights in '<file>.data' next to it when present)."},
        "inputs": {"type": "array", "items": {"type": "string"},
                   "description": "Tensors the stage reads (model inputs or outputs of earlier stages)."},
        "outputs": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                    "description": "Tensors the stage produces for later stages or as model outputs."},
        "block": {"type": ["integer", "null"], "minimum": 0,
                  "description": "Transformer block index; null for prologue, epilogue and shared parts."},
        "blocks": {"type": "array", "items": {"type": "integer", "minimum": 0},
                   "description": "Every block the stage covers (several for fused runs of blocks)."},
        "region": {"type": "string", "description": "What part of the block: 'attn', 'xattn', 'jattn', "
                   "'ffn', 'block', 'prologue', 'epilogue', 'host', 'cut', ..."},
        "kind": {"type": "string", "description": "What the stage holds, '+'-joined: e.g. 'attn', "
                 "'mod+adaln', 'gate+residual'."},
        "weight_bytes": {"type": "integer", "minimum": 0, "description": "Bytes of weights in the stage."},
        "io_bytes": {"type": "integer", "minimum": 0, "description": "Bytes of its inputs plus outputs."},
        "sha256": {**_HEX64, "description": "sha256 of the stage's ONNX file followed by its data file."},
        "num_nodes": {"type": "integer", "minimum": 0, "description": "Nodes in the stage's graph."},
        "artifacts": {"type": "array", "items": _ARTIFACT},
        "failures": {"type": "array", "items": {"type": "object"},
                     "description": "Build failures recorded by 'rkpart compile' (toolkit, message, ...)."},
        "prepared": {
            "type": "object",
            "description": "Set by 'rkpart compile' when the toolkit builds a prepared copy of the stage "
                           "instead of 'file': its opset lowered to what the toolkit loads and/or NPU "
                           "rewrites applied, each checked equal under ONNX Runtime first.",
            "required": ["file", "sha256", "toolkit", "from_opset", "to_opset", "rewrites"],
            "properties": {
                "file": {**_REL_PATH, "description": "The prepared ONNX file, relative to the plan folder."},
                "sha256": {**_HEX64, "description": "sha256 of the prepared file followed by its data file "
                                                    "(checked before rknn-sim loads it)."},
                "toolkit": {"type": "string", "description": "Toolkit version it was prepared for."},
                "from_opset": {"type": "integer", "description": "The stage's default-domain opset."},
                "to_opset": {"type": "integer", "description": "The prepared copy's opset (equal: not lowered)."},
                "rewrites": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1},
                             "description": "Rewrite name (rkpart.targets.rewrites.REWRITES) -> matches "
                                            "rewritten."},
                "dropped_rewrites": {"type": "object", "additionalProperties": {"type": "string"},
                                     "description": "NPU rewrites that matched but were left out -> why: "
                                                    "the rewritten stage differed under ONNX Runtime, or the "
                                                    "toolkit's build failed with it (compile rebuilt the stage "
                                                    "without it)."},
                "weighed": {"type": "object",
                            "description": "The rewrites weighed for memory (they change only a layout) and the "
                                           "verdict: the stage built with and without them, the compiler's CPU "
                                           "layers and weight / internal memory of each, and whether they were "
                                           "kept (fewer CPU layers, then less device memory; equal: left out)."},
            },
        },
    },
}
#: every integer bounded by :data:`rkpart.io.MAX_JSON_INT` (:func:`rkpart.io.bounded_integers`)
PLAN_SCHEMA: JsonObject = bounded_integers({
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://rkpart.invalid/plan.schema.json",
    "title": "rkpart plan",
    "description": "plan.json: a DiT ONNX model cut into stages, in execution order (docs/plan.md).",
    "type": "object",
    "required": ["format", "version", "model", "strategy", "inputs", "outputs", "tensors", "stages"],
    "properties": {
        "format": {"const": "rkpart-plan", "description": "Always 'rkpart-plan'."},
        "version": {"const": 1, "description": "Format version; readers refuse versions they do not know."},
        "model": {
            "type": "object",
            "description": "The source model.",
            "required": ["file", "sha256"],
            "properties": {
                "file": {"type": "string", "minLength": 1, "description": "File name of the source model."},
                "sha256": {**_HEX64, "description": "sha256 of the source model file (not its external data)."},
                "opset": {"type": "integer", "minimum": 1, "description": "Default-domain opset, kept by every stage."},
                "path": {"type": "string", "description": "Absolute path the model was read from (informative; "
                         "'rkpart run' uses it to find the whole model for comparison)."},
                "nodes": {"type": "integer", "minimum": 0, "description": "Node count of the source graph."},
            },
        },
        "strategy": {
            "type": "object",
            "description": "How the plan was made.",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "minLength": 1, "description": "'split', 'fused', 'custom' or a plugin."},
                "options": {"type": "object", "description": "Strategy options after defaults were applied."},
            },
        },
        "inputs": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                   "description": "Model inputs, in the model's order."},
        "outputs": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                    "description": "Model outputs, in the model's order."},
        "tensors": {"type": "object", "additionalProperties": _TENSOR,
                    "description": "Every model input/output and stage boundary tensor, by name."},
        "blocks": {
            "type": "array",
            "description": "Discovery summary: the transformer blocks found and their regions.",
            "items": {
                "type": "object",
                "required": ["index"],
                "properties": {
                    "index": {"type": "integer", "minimum": 0},
                    "scope": {"type": ["string", "null"], "description": "Exporter name scope, if any."},
                    "regions": {"type": "array", "items": {"type": "object"},
                                "description": "[{name, kind, adaln, gated}] per residual branch."},
                },
            },
        },
        "stages": {"type": "array", "items": _STAGE, "minItems": 1,
                   "description": "Stages in execution order."},
        "specialised": {
            "type": "array",
            "description": "Shapes the data decided, observed by one ONNX Runtime run on 'rkpart partition --inputs': "
                           "one record per data-dependent op (NonZero, If, a sequence op). 'rkpart run' and the "
                           "bundle runner refuse inputs that differ, at the model inputs listed, from the ones the "
                           "plan was made on.",
            "items": {
                "type": "object",
                "required": ["op", "node", "tensor", "shape", "inputs"],
                "additionalProperties": False,
                "properties": {
                    "op": {"type": "string", "minLength": 1, "description": "Op type of the data-dependent op."},
                    "node": {"type": "string", "description": "Its node name (may be empty)."},
                    "tensor": {"type": "string", "minLength": 1, "description": "Its output whose shape the data "
                                                                               "decided."},
                    "shape": {"type": "array", "items": {"type": "integer", "minimum": 0},
                              "description": "That shape in the run on --inputs."},
                    "branch": {"enum": ["then_branch", "else_branch"],
                               "description": "If only: the branch its condition took on --inputs, which replaced "
                                              "the If in the plan."},
                    "inputs": {"type": "object", "additionalProperties": _HEX64,
                               "description": "Model input -> sha256 of its dtype, shape and bytes in --inputs "
                                              "(the inputs the op depends on)."},
                    "trips": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0},
                              "description": "A sequence Loop's ops only: loop node -> the trip count it was "
                                             "unrolled for."},
                    "inputs_file": {"type": "string", "minLength": 1,
                                    "description": "Absolute path of the --inputs file (compile --repartition "
                                                   "partitions again specialised to it)."},
                },
            },
        },
        "extra": {"type": "object", "description": "Free-form notes (discovery method, strategy notes and warnings, "
                                                  "npu_coverage: the blocks' token-wise matmul work in NPU stages).",
                  "properties": {
                      "compile": {"type": "object", "description": "What the last rkpart compile recorded (its "
                                                                   "settings; estimate reads the toolkit).",
                                  "properties": {"toolkit": {"type": ["string", "null"]}}},
                  }},
    },
})


def schema_json() -> str:
    """:data:`PLAN_SCHEMA` as the text of ``docs/plan.schema.json`` (stable formatting)."""
    return json.dumps(PLAN_SCHEMA, indent=2, sort_keys=True) + "\n"


def _valid_dtype(name: str) -> bool:
    try:
        dt = np.dtype(name)
    except (TypeError, ValueError):
        return False
    return dt.kind in "biufc" or dt.name == "bfloat16"


def validate_plan_json(data: object) -> None:
    """Schema check plus cross-references; raises :class:`SpecError` naming the first problem."""
    if not isinstance(data, Mapping):
        raise SpecError("plan is not a JSON object")
    v = jsonschema.Draft202012Validator(PLAN_SCHEMA)
    errs = sorted(v.iter_errors(data), key=lambda e: [str(x) for x in e.absolute_path])
    if errs:
        e = errs[0]
        loc = "/".join(str(x) for x in e.absolute_path) or "(top level)"
        if e.validator == "pattern" and e.schema.get("pattern") == _REL_PATH["pattern"]:
            raise SpecError(f"invalid plan: at {loc}: path {e.instance!r} leaves the plan folder")
        msg = e.message if len(e.message) < 200 else e.message[:200] + "..."
        raise SpecError(f"invalid plan: at {loc}: {msg}")
    tensors = data["tensors"]
    for k, t in tensors.items():
        if t["name"] != k:
            raise SpecError(f"invalid plan: tensors/{k} is named {t['name']!r}")
        if not _valid_dtype(t["dtype"]):
            raise SpecError(f"invalid plan: tensors/{k}: unknown dtype {t['dtype']!r}")
    for t in [*data["inputs"], *data["outputs"]]:
        if t not in tensors:
            raise SpecError(f"invalid plan: model tensor {t!r} is missing from 'tensors'")
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
    for k, rec in enumerate(data.get("specialised", ())):
        for t in rec["inputs"]:
            if t not in data["inputs"]:
                raise SpecError(f"invalid plan: specialised/{k} names {t!r}, which is not a model input")
