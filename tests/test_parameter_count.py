"""No library function in ``rkpart/`` takes more than :data:`MAX_PARAMETERS` parameters.

A function that needs more takes an options object (a frozen dataclass) instead.  Exempt:
click commands, which mirror their options one parameter each, the keyword-only drop-in
:func:`rkpart.dropin.build`, which mirrors RKNN's own ``build``, and the SANA-WM export rewrite's
``forward_precomputed``, which mirrors the diffusers forward it replaces.  ``self`` / ``cls`` do not count;
``*args`` and ``**kwargs`` count one each.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "rkpart"
MAX_PARAMETERS = 10
EXEMPT = {
    ("dropin.py", "build"),
    # replaces SanaWMTransformer3DModel.forward (14 parameters) for the export: its arguments, with
    # cam_pos_embeds spread into its three tensors, by name, because the exporter's wrapper feeds each
    # graph input (and fixed value) as the keyword forward names it; an options object cannot be a graph input
    ("export/rewrites/rope.py", "forward_precomputed"),
}


def _is_click_command(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for d in fn.decorator_list:
        call = d.func if isinstance(d, ast.Call) else d
        name = call.attr if isinstance(call, ast.Attribute) else call.id if isinstance(call, ast.Name) else ""
        if name in ("command", "group"):
            return True
    return False


def _count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [*a.posonlyargs, *a.args]
    n = len(names) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return n - (1 if names and names[0].arg in ("self", "cls") else 0)


def offenders() -> list[str]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if _is_click_command(node) or (rel, node.name) in EXEMPT:
                continue
            n = _count(node)
            if n > MAX_PARAMETERS:
                out.append(f"rkpart/{rel}:{node.lineno} {node.name}() takes {n} parameters")
    return out


@pytest.mark.slow  # parses every module of the package (about 1 s)
def test_no_library_function_takes_more_than_ten_parameters() -> None:
    assert offenders() == []


def test_the_count_sees_a_long_signature() -> None:
    fn = ast.parse("def f(self, a, b, /, c, *d, e, **f): pass").body[0]
    assert isinstance(fn, ast.FunctionDef) and _count(fn) == 6
