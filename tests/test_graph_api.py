"""Packages above :mod:`rkpart.ir` read the loaded model through its graph API, never its protos.

Every module under ``rkpart/`` outside ``rkpart/ir/`` is parsed with :mod:`ast`.  A
*ModelGraph expression* is a name ``mg``, an attribute ``.mg`` (``self.mg``, ``cut.mg``), or a
name annotated ``ModelGraph`` (a parameter, an annotated assignment) in that module.  Refused:

* ``<ModelGraph>.nodes`` (the raw ``NodeProto`` list: read ops as ``mg.op(i)``, an
  :class:`~rkpart.ir.graph.OpNode`; a stage gets a copy from ``mg.node_proto(i)``);
* ``<ModelGraph>.scopes`` (gone: ``mg.op(i).scope``);
* ``<ModelGraph>.model.graph`` (the parsed model's graph, its nodes included);
* ``shape_inference`` anywhere (an import or an attribute): only ``rkpart.ir`` infers types.

Stages read back from disk are other ``ModelProto`` objects (what a rewrite edits, what a
runner loads): not the loaded model, not covered.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "rkpart"

#: module -> why it may still read the loaded model's protos
ALLOWED: dict[str, str] = {}

FORBIDDEN = {"nodes", "scopes"}


def _annotated_modelgraph(tree: ast.AST) -> set[str]:
    names = {"mg"}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None and "ModelGraph" in ast.unparse(node.annotation):
            names.add(node.arg)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and "ModelGraph" in ast.unparse(node.annotation):
            names.add(node.target.id)
    return names


def _is_mg(expr: ast.expr, names: set[str]) -> bool:
    return (isinstance(expr, ast.Name) and expr.id in names) or (isinstance(expr, ast.Attribute) and expr.attr == "mg")


def _refused(node: ast.AST, names: set[str]) -> str | None:
    """Why ``node`` is refused (``None`` when it is not)."""
    if isinstance(node, ast.Attribute):
        on_mg = node.attr in FORBIDDEN and _is_mg(node.value, names)
        on_model = node.attr == "graph" and isinstance(node.value, ast.Attribute) and node.value.attr == "model" \
            and _is_mg(node.value.value, names)
        if on_mg or on_model:
            return ast.unparse(node)
        if node.attr == "shape_inference":
            return f"{ast.unparse(node)} (only rkpart.ir infers shapes)"
        return None
    imported = [a.name for a in node.names] if isinstance(node, ast.Import | ast.ImportFrom) else []
    if isinstance(node, ast.ImportFrom):
        imported.append(node.module or "")
    if any("shape_inference" in m for m in imported):
        return "imports shape_inference (only rkpart.ir infers shapes)"
    return None


def violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = _annotated_modelgraph(tree)
    return [f"{n.lineno}: {why}" for n in ast.walk(tree)  # type: ignore[attr-defined]
            if (why := _refused(n, names)) is not None]


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] != "ir")


@pytest.mark.slow  # parses every module of the package (about 1 s)
def test_no_module_above_ir_reads_the_loaded_models_protos() -> None:
    bad = {}
    for p in _modules():
        rel = p.relative_to(ROOT).as_posix()
        v = violations(p)
        if v and rel not in ALLOWED:
            bad[rel] = v
    assert not bad, bad


@pytest.mark.slow  # parses every module of the package (about 1 s)
def test_one_module_runs_shape_inference() -> None:
    """Inside ``rkpart.ir`` too, ONNX shape inference runs in :mod:`rkpart.ir.infer` only (one helper:
    on a copy without the large weights)."""
    runs = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py")
                  if any(isinstance(n, ast.Attribute) and n.attr == "shape_inference"
                         for n in ast.walk(ast.parse(p.read_text()))))
    assert runs == ["ir/infer.py"]


def test_the_rule_sees_what_it_refuses(tmp_path: Path) -> None:
    """The scan finds each refused form (a rule that finds nothing proves nothing)."""
    src = tmp_path / "m.py"
    src.write_text(
        "import onnx.shape_inference\n"
        "def f(g: ModelGraph, x):\n"
        "    a = g.nodes[0].op_type\n"
        "    b = x.mg.scopes[1]\n"
        "    c = mg.model.graph.node\n"
        "    d = onnx.shape_inference.infer_shapes(x)\n"
        "    e = x.nodes  # not a ModelGraph: fine\n"
        "    return mg.op(0).op_type\n")
    assert sorted(int(v.split(":")[0]) for v in violations(src)) == [1, 3, 4, 5, 6]


def test_allow_list_is_still_needed() -> None:
    """An entry that no longer reads protos goes (so the list only shrinks)."""
    for rel in ALLOWED:
        assert violations(ROOT / rel), f"{rel} is clean: remove it from ALLOWED"
