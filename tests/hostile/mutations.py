"""Mutations of ONNX models for the fuzz tests: raw bytes and structured ``ModelProto`` edits.

Each mutation takes a hypothesis ``draw`` function so hypothesis can shrink a failing case to
the smallest edit; each returns a short description used in failure reports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import networkx as nx
import onnx
from hypothesis import strategies as st
from onnx import AttributeProto, TensorProto

Draw = Callable[[st.SearchStrategy[Any]], Any]

#: dims a fuzzer tries: zero, negative, huge, plus ordinary small ones
DIMS = st.one_of(st.sampled_from([0, -1, -8, 1, 2, 3, 7, 1 << 20, 1 << 31, 1 << 50, (1 << 63) - 1]),
                 st.integers(min_value=0, max_value=64))
#: ONNX element types, valid and not (0 = UNDEFINED, 8 = STRING, 99 = nonsense)
DTYPES = st.sampled_from([0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 16, 17, 23, 99])


# -- bytes ----------------------------------------------------------------------------------


def mutate_bytes(draw: Draw, data: bytes) -> tuple[bytes, str]:
    """Flip, overwrite, insert, delete or truncate bytes of a serialized model."""
    kind = draw(st.sampled_from(["flip", "overwrite", "insert", "delete", "truncate", "multi-flip"]))
    b = bytearray(data)
    n = len(b)
    if kind == "truncate":
        cut = draw(st.integers(min_value=0, max_value=n - 1))
        return bytes(b[:cut]), f"truncate at {cut}/{n}"
    if kind == "multi-flip":
        pos = draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=16))
        for p in pos:
            b[p] ^= 1 << draw(st.integers(0, 7))
        return bytes(b), f"flip bits at {pos}"
    # bias towards the graph structure: the serialized graph tail holds nodes, the head often
    # holds raw weights whose bytes change nothing structural
    pos = draw(st.one_of(st.integers(0, n - 1), st.integers(max(0, n - 4096), n - 1),
                         st.integers(0, min(n - 1, 4096))))
    if kind == "flip":
        b[pos] ^= 1 << draw(st.integers(0, 7))
    elif kind == "overwrite":
        b[pos] = draw(st.integers(0, 255))
    elif kind == "insert":
        b[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    else:
        del b[pos:pos + draw(st.integers(1, 16))]
    return bytes(b), f"{kind} at {pos}/{n}"


# -- structure ------------------------------------------------------------------------------


def _tensor_names(m: onnx.ModelProto) -> list[str]:
    g = m.graph
    names = [i.name for i in g.input] + [i.name for i in g.initializer]
    names += [t for n in g.node for t in n.output if t]
    return sorted(set(names))


def _pick(draw: Draw, seq: list[Any]) -> Any:
    return seq[draw(st.integers(0, len(seq) - 1))]


def drop_node(draw: Draw, m: onnx.ModelProto) -> str:
    i = draw(st.integers(0, len(m.graph.node) - 1))
    n = m.graph.node[i]
    del m.graph.node[i]
    return f"drop node {i} {n.op_type} {n.name}"


def rewire_input(draw: Draw, m: onnx.ModelProto) -> str:
    nodes = [n for n in m.graph.node if n.input]
    if not nodes:
        return "no-op"
    n = _pick(draw, nodes)
    j = draw(st.integers(0, len(n.input) - 1))
    new = draw(st.one_of(st.sampled_from(_tensor_names(m)), st.just("does_not_exist"), st.just("")))
    n.input[j] = new
    return f"rewire {n.name} input {j} -> {new!r}"


def change_dim(draw: Draw, m: onnx.ModelProto) -> str:
    g = m.graph
    vis = [*g.input, *g.output, *g.value_info]
    vis = [v for v in vis if v.type.HasField("tensor_type") and v.type.tensor_type.shape.dim]
    choice = draw(st.sampled_from(["value_info", "initializer"]))
    if choice == "initializer" and g.initializer:
        init = _pick(draw, list(g.initializer))
        if not init.dims:
            init.dims.append(draw(DIMS))
            return f"initializer {init.name} gains a dim"
        k = draw(st.integers(0, len(init.dims) - 1))
        init.dims[k] = draw(DIMS)
        return f"initializer {init.name} dim {k} -> {init.dims[k]}"
    if not vis:
        return "no-op"
    v = _pick(draw, vis)
    dims = v.type.tensor_type.shape.dim
    k = draw(st.integers(0, len(dims) - 1))
    if draw(st.booleans()):
        dims[k].dim_value = draw(DIMS)
        return f"{v.name} dim {k} -> {dims[k].dim_value}"
    dims[k].dim_param = draw(st.sampled_from(["N", "batch", ""]))
    return f"{v.name} dim {k} -> symbolic"


def change_dtype(draw: Draw, m: onnx.ModelProto) -> str:
    g = m.graph
    if draw(st.booleans()) and g.initializer:
        init = _pick(draw, list(g.initializer))
        init.data_type = draw(DTYPES)
        return f"initializer {init.name} dtype -> {init.data_type}"
    v = _pick(draw, [*g.input, *g.output])
    v.type.tensor_type.elem_type = draw(DTYPES)
    return f"{v.name} dtype -> {v.type.tensor_type.elem_type}"


def change_attribute(draw: Draw, m: onnx.ModelProto) -> str:
    nodes = [n for n in m.graph.node if n.attribute]
    if not nodes:
        return "no-op"
    n = _pick(draw, nodes)
    a = _pick(draw, list(n.attribute))
    if a.type == AttributeProto.INT:
        a.i = draw(st.one_of(st.integers(-4, 8), st.sampled_from([1 << 40, -(1 << 40)])))
        return f"{n.name}.{a.name} = {a.i}"
    if a.type == AttributeProto.FLOAT:
        a.f = draw(st.sampled_from([0.0, -1.0, float("nan"), float("inf"), 1e30]))
        return f"{n.name}.{a.name} = {a.f}"
    if a.type == AttributeProto.INTS:
        vals = draw(st.lists(st.integers(-5, 5), max_size=5))
        del a.ints[:]
        a.ints.extend(vals)
        return f"{n.name}.{a.name} = {vals}"
    if a.type == AttributeProto.STRING:
        a.s = draw(st.sampled_from([b"", b"bogus", b"tanh"]))
        return f"{n.name}.{a.name} = {a.s!r}"
    if a.type == AttributeProto.TENSOR:
        a.t.data_type = draw(DTYPES)
        return f"{n.name}.{a.name} tensor dtype -> {a.t.data_type}"
    # a wrong attribute type for the op
    a.type = AttributeProto.STRING
    a.s = b"x"
    return f"{n.name}.{a.name} retyped to STRING"


def duplicate_name(draw: Draw, m: onnx.ModelProto) -> str:
    names = _tensor_names(m)
    n = _pick(draw, list(m.graph.node))
    if not n.output:
        return "no-op"
    new = _pick(draw, names)
    old = n.output[0]
    n.output[0] = new
    return f"{n.name} output {old} renamed to existing {new}"


def add_cycle(draw: Draw, m: onnx.ModelProto) -> str:
    nodes = list(m.graph.node)
    producer = {t: i for i, n in enumerate(nodes) for t in n.output}
    dag = nx.DiGraph()
    for i, n in enumerate(nodes):
        for t in n.input:
            if t in producer:
                dag.add_edge(producer[t], i)
    cands = [i for i in dag.nodes if nodes[i].input and nx.descendants(dag, i)]
    if not cands:
        return "no-op"
    i = _pick(draw, sorted(cands))
    j = _pick(draw, sorted(nx.descendants(dag, i)))
    k = draw(st.integers(0, len(nodes[i].input) - 1))
    nodes[i].input[k] = nodes[j].output[0]
    return f"cycle: {nodes[i].name} input {k} <- {nodes[j].name}"


def change_op_type(draw: Draw, m: onnx.ModelProto) -> str:
    n = _pick(draw, list(m.graph.node))
    old = n.op_type
    n.op_type = draw(st.sampled_from(["Add", "Relu", "MatMul", "Softmax", "Identity", "If", "Loop", "NoSuchOp",
                                      "Reshape", "Concat", "LayerNormalization"]))
    return f"{n.name} {old} -> {n.op_type}"


def change_opset(draw: Draw, m: onnx.ModelProto) -> str:
    v = draw(st.sampled_from([0, 1, 3, 6, 7, 11, 13, 18, 21, 22, 23, 24, 99, -1]))
    m.opset_import[0].version = v
    return f"opset -> {v}"


def drop_initializer(draw: Draw, m: onnx.ModelProto) -> str:
    if not m.graph.initializer:
        return "no-op"
    i = draw(st.integers(0, len(m.graph.initializer) - 1))
    name = m.graph.initializer[i].name
    del m.graph.initializer[i]
    return f"drop initializer {name}"


def mangle_initializer_data(draw: Draw, m: onnx.ModelProto) -> str:
    inits = [i for i in m.graph.initializer if i.raw_data]
    if not inits:
        return "no-op"
    init = _pick(draw, inits)
    cut = draw(st.integers(0, len(init.raw_data)))
    init.raw_data = init.raw_data[:cut]
    return f"initializer {init.name} raw_data cut to {cut}"


def change_graph_io(draw: Draw, m: onnx.ModelProto) -> str:
    g = m.graph
    kind = draw(st.sampled_from(["drop-output", "output-internal", "drop-input", "extra-input"]))
    if kind == "drop-output" and g.output:
        del g.output[0]
    elif kind == "output-internal":
        t = _pick(draw, _tensor_names(m))
        g.output.append(onnx.helper.make_tensor_value_info(t, TensorProto.FLOAT, None))
    elif kind == "drop-input" and g.input:
        del g.input[draw(st.integers(0, len(g.input) - 1))]
    else:
        g.input.append(onnx.helper.make_tensor_value_info("extra", TensorProto.FLOAT, [2]))
    return kind


def swap_nodes(draw: Draw, m: onnx.ModelProto) -> str:
    n = len(m.graph.node)
    i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
    a, b = onnx.NodeProto(), onnx.NodeProto()
    a.CopyFrom(m.graph.node[i])
    b.CopyFrom(m.graph.node[j])
    m.graph.node[i].CopyFrom(b)
    m.graph.node[j].CopyFrom(a)
    return f"swap nodes {i} and {j}"


STRUCTURED: dict[str, Callable[[Draw, onnx.ModelProto], str]] = {
    f.__name__: f
    for f in (drop_node, rewire_input, change_dim, change_dtype, change_attribute, duplicate_name, add_cycle,
              change_op_type, change_opset, drop_initializer, mangle_initializer_data, change_graph_io, swap_nodes)
}


def mutate_structure(draw: Draw, m: onnx.ModelProto) -> str:
    """Apply one to three structured mutations in place; returns what was done."""
    done = []
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(sorted(STRUCTURED)))
        done.append(STRUCTURED[name](draw, m))
    return "; ".join(done)


# -- plan folders -----------------------------------------------------------------------------
# Mutations of a plan folder in place: plan.json (as JSON and as bytes) and the files it names
# (stage .onnx/.data, compiled objects and their cache records).  ``outside`` is a folder next
# to the plan that the mutations may point at and that nothing may write into.

#: values a fuzzer puts into plan.json fields
JSON_VALUES = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 1 << 62, -(1 << 62), 1.5, float("inf"), "", "x", "../x", "/etc/passwd",
                     [], {}, [1, 2], {"a": 1}, "float64", "int64", "float16", "bfloat16", "bool", "0" * 64]),
    st.integers(), st.text(max_size=12),
)


def _json_paths(d: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(d, dict):
        for k, v in d.items():
            out += _json_paths(v, (*prefix, k))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out += _json_paths(v, (*prefix, i))
    return out


def _get(d: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        d = d[k]
    return d


def _stage_files(folder: Any, plan: dict[str, Any], npu_only: bool = False) -> list[Any]:
    return [folder / s["file"] for s in plan["stages"]
            if isinstance(s, dict) and (not npu_only or s.get("device") == "npu")]


def mutate_plan_json(draw: Draw, plan: dict[str, Any], outside: Any) -> str:
    """Edit the parsed plan.json in place; returns what was done."""
    kind = draw(st.sampled_from(["set", "delete", "tensor", "swap-stages", "swap-field", "path", "model-path",
                                 "duplicate-stage", "drop-stage", "io"]), label="plan edit")
    stages = plan["stages"]
    if kind in ("set", "delete"):
        paths = [p for p in _json_paths(plan) if p]
        path = draw(st.sampled_from(paths), label="json path")
        parent = _get(plan, path[:-1])
        if kind == "delete":
            del parent[path[-1]]
            return f"delete {'/'.join(map(str, path))}"
        v = draw(JSON_VALUES, label="value")
        parent[path[-1]] = v
        return f"set {'/'.join(map(str, path))} = {v!r}"
    if kind == "tensor":
        name = draw(st.sampled_from(sorted(plan["tensors"])), label="tensor")
        t = plan["tensors"][name]
        how = draw(st.sampled_from(["dtype", "dim", "rank+", "rank-"]))
        if how == "dtype":
            t["dtype"] = draw(st.sampled_from(["float64", "float16", "int64", "int32", "bool", "uint8"]))
        elif how == "dim" and t["shape"]:
            i = draw(st.integers(0, len(t["shape"]) - 1))
            t["shape"][i] = draw(st.sampled_from([0, 1, 2, t["shape"][i] + 1, t["shape"][i] * 2]))
        elif how == "rank+":
            t["shape"].append(1)
        elif t["shape"]:
            t["shape"].pop()
        return f"tensor {name}: {how} -> {t['dtype']}{t['shape']}"
    if kind == "swap-stages" and len(stages) > 1:
        i, j = draw(st.lists(st.integers(0, len(stages) - 1), min_size=2, max_size=2, unique=True))
        stages[i], stages[j] = stages[j], stages[i]
        return f"swap stages {i} and {j}"
    if kind == "swap-field" and len(stages) > 1:
        f = draw(st.sampled_from(["file", "sha256", "inputs", "outputs", "device", "artifacts"]))
        i, j = draw(st.lists(st.integers(0, len(stages) - 1), min_size=2, max_size=2, unique=True))
        stages[i][f], stages[j][f] = stages[j].get(f), stages[i].get(f)
        return f"swap {f} of stages {i} and {j}"
    if kind == "path":
        i = draw(st.integers(0, len(stages) - 1))
        p = draw(st.sampled_from(["/etc/passwd", "../outside/secret.onnx", "stages/../../outside/secret.onnx",
                                  str(outside / "secret.onnx"), "stages", ".", "plan.json", "stages/nope.onnx"]))
        stages[i]["file"] = p
        return f"stage {i} file = {p!r}"
    if kind == "model-path":
        p = draw(st.sampled_from(["/etc/passwd", "/dev/zero", str(outside / "secret.onnx"), str(outside / "fifo"),
                                  "relative.onnx", ""]))
        plan["model"]["path"] = p
        return f"model.path = {p!r}"
    if kind == "duplicate-stage":
        i = draw(st.integers(0, len(stages) - 1))
        stages.insert(i, dict(stages[i]))
        return f"duplicate stage {i}"
    if kind == "drop-stage":
        i = draw(st.integers(0, len(stages) - 1))
        del stages[i]
        return f"drop stage {i}"
    # io: model inputs/outputs lists
    key = draw(st.sampled_from(["inputs", "outputs"]))
    if plan[key] and draw(st.booleans()):
        plan[key].reverse() if len(plan[key]) > 1 else plan[key].pop()
    else:
        plan[key].append(draw(st.sampled_from(sorted(plan["tensors"]))))
    return f"model {key} -> {plan[key]}"


def mutate_plan_files(draw: Draw, folder: Any, plan: dict[str, Any], outside: Any) -> str:
    """Change, swap, replace or remove a file the plan names (plan.json itself untouched)."""
    import os
    import shutil

    def real(p: Any) -> bool:
        return bool(p.is_file() and not p.is_symlink())

    files = sorted({p for p in _stage_files(folder, plan) if real(p)})
    datas = [p.with_name(p.name + ".data") for p in files if real(p.with_name(p.name + ".data"))]
    objects = sorted(p for p in (folder / "rknn" / "objects").glob("*.rknn") if real(p)) \
        if (folder / "rknn").is_dir() else []
    metas = sorted(p for p in (folder / "rknn" / "objects").glob("*.json") if real(p)) \
        if (folder / "rknn").is_dir() else []
    kinds = ["swap-onnx", "swap-data", "flip-onnx", "flip-data", "truncate-onnx", "truncate-data", "fifo", "devzero",
             "symlink-out", "dir", "delete", "garbage"]
    if objects:
        kinds += ["flip-object", "truncate-object", "fifo-object", "symlink-object", "delete-object"] * 2
    if metas:
        kinds += ["garbage-meta", "deep-meta", "fail-record"]
    kind = draw(st.sampled_from(kinds), label="file edit")

    def pick(seq: list[Any], label: str) -> Any:
        return draw(st.sampled_from(seq), label=label)

    def flip(p: Any) -> None:
        raw = bytearray(p.read_bytes())
        if raw:
            raw[draw(st.integers(0, len(raw) - 1))] ^= 1 << draw(st.integers(0, 7))
        p.write_bytes(bytes(raw))

    def replace_with(p: Any, how: str) -> None:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif os.path.lexists(p):
            p.unlink()
        if how == "fifo":
            os.mkfifo(p)
        elif how == "devzero":
            os.symlink("/dev/zero", p)
        elif how == "symlink-out":
            target = outside / f"copy-of-{p.name}"
            os.symlink(target, p)
        elif how == "dir":
            p.mkdir()

    if kind.startswith("swap-"):
        pool = files if kind == "swap-onnx" else datas
        if len(pool) < 2:
            return "no-op (too few files)"
        a, b = draw(st.lists(st.sampled_from(pool), min_size=2, max_size=2, unique=True), label="pair")
        tmp = a.with_name(".swap")
        a.rename(tmp)
        b.rename(a)
        tmp.rename(b)
        return f"swap {a.name} and {b.name}"
    if kind in ("flip-onnx", "flip-data", "truncate-onnx", "truncate-data"):
        pool = files if kind.endswith("onnx") else datas
        if not pool:
            return "no-op (no file)"
        p = pick(pool, "file")
        if kind.startswith("flip"):
            flip(p)
        else:
            n = p.stat().st_size
            with open(p, "r+b") as f:
                f.truncate(draw(st.integers(0, max(0, n - 1))))
        return f"{kind} {p.name}"
    if kind in ("fifo", "devzero", "symlink-out", "dir", "delete", "garbage"):
        p = pick(files + datas, "file")
        if kind == "symlink-out":
            shutil.copyfile(p, outside / f"copy-of-{p.name}")  # same bytes: only the location is wrong
        if kind == "delete":
            p.unlink()
        elif kind == "garbage":
            p.write_bytes(draw(st.binary(min_size=0, max_size=64), label="garbage"))
        else:
            replace_with(p, kind)
        return f"{kind} {p.name}"
    if kind.endswith("-object"):
        p = pick(objects, "object")
        if kind == "flip-object":
            flip(p)
        elif kind == "truncate-object":
            with open(p, "r+b") as f:
                f.truncate(max(0, p.stat().st_size - 1))
        elif kind == "fifo-object":
            replace_with(p, "fifo")
        elif kind == "symlink-object":
            shutil.copyfile(p, outside / f"copy-of-{p.name}")
            replace_with(p, "symlink-out")
        else:
            p.unlink()
        return f"{kind} {p.name}"
    m = pick(metas, "meta")
    if kind == "garbage-meta":
        m.write_bytes(draw(st.binary(max_size=32), label="garbage"))
    elif kind == "deep-meta":
        m.write_text("[" * 5000 + "]" * 5000 if draw(st.booleans()) else '{"size_bytes": ' + "9" * 5000 + "}")
    else:
        import json

        key = m.name.split(".")[0]
        (m.parent / f"{key}.fail.json").write_text(json.dumps(
            {"toolkit": "fake", "kind": draw(st.sampled_from(["crash", "timeout", "oom", "resource", "?"])),
             "message": "planted"}))
    return f"{kind} {m.name}"
