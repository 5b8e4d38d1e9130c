"""The packages of rkpart import each other in one direction only.

Every module under ``rkpart/`` is parsed with :mod:`ast`; every ``import`` counts, also the
ones inside functions (a function-level import is still a dependency, only a hidden one).
A *package* is a direct child of ``rkpart``: a subpackage (``rkpart/compile/``) or a
top-level module (``rkpart/dropin.py``).  Two checks:

* no cycle between packages (the failure names every cycle);
* the layers below, lowest first: a package may import only from its own layer or one to
  its left.  ``rkpart/__init__.py`` (the lazy public API) names everything and is exempt.

The order is also documented in :mod:`rkpart.pipeline`.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import networkx as nx
import pytest

# outside the fast tier: parses every module of the package (the fast tier stays under a minute of CPU)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1] / "rkpart"

#: lowest first; a package may import from its own layer and the layers before it
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "types"),
    ("io", "readers", "output", "units", "progress", "description"),
    ("export",),
    ("ir",),
    ("targets",),
    ("plugins",),
    ("discovery",),
    ("grouping",),
    ("plan",),
    ("recognizers", "strategies"),  # kept for plugins: the old paths, re-exporting discovery/ and grouping/
    ("validation", "roles"),
    ("compile",),
    ("runtime",),
    ("triage",),
    ("profile",),
    ("cost_model",),
    ("bundle", "report"),
    ("auto",),
    ("grounding",),
    ("pipeline",),
    ("repartition",),
    ("tune", "board"),
    ("dropin",),
    ("cli_args",),
    ("commands",),
    ("cli",),
    ("__main__",),
)


def _package(module: str) -> str:
    """``rkpart.compile.runner`` -> ``compile``; ``rkpart`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _is_package(name: str) -> bool:
    return (ROOT / f"{name}.py").is_file() or (ROOT / name / "__init__.py").is_file()


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = module.split(".")
        if not is_package:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join([*base, *([node.module] if node.module else [])])
    else:
        target = node.module or ""
    if target == "rkpart":  # "from rkpart import x": x is a package, or a name of rkpart/__init__.py
        return [f"rkpart.{a.name}" if _is_package(a.name) else "rkpart" for a in node.names]
    return [target]


def package_imports() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> the ``file:line`` of every such import."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(ROOT.rglob("*.py")):
        module = _module_name(path)
        src = _package(module)
        if src == "__init__":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _imported(module, path.name == "__init__.py", node):
                if target.startswith("rkpart."):
                    dst = _package(target)
                    if dst not in (src, "__init__"):
                        edges[(src, dst)].append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    return edges


def _module_of(target: str, names: list[str]) -> list[str]:
    """The modules ``from target import names`` (or ``import target``) reads: a submodule named in
    ``names``, else the module (or package) ``target`` itself."""
    if not target.startswith("rkpart"):
        return []
    path = ROOT.parent / target.replace(".", "/")
    subs = [f"{target}.{n}" for n in names if (path / f"{n}.py").is_file() or (path / n / "__init__.py").is_file()]
    rest = [n for n in names if f"{target}.{n}" not in subs]
    return subs + ([target] if rest or not names else [])


def module_imports() -> dict[tuple[str, str], list[str]]:
    """(importing module, imported module) -> the ``file:line`` of every such import, every module of
    ``rkpart`` a node (a package's ``__init__.py`` is the package's name)."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(ROOT.rglob("*.py")):
        module = _module_name(path)
        if module == "rkpart":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [t for a in node.names for t in _module_of(a.name, [])]
            elif isinstance(node, ast.ImportFrom):
                base = _imported(module, path.name == "__init__.py", node)
                # "from rkpart import x": resolved by _imported; else a submodule named is the module read
                from_rkpart = node.level == 0 and node.module == "rkpart"
                targets = base if from_rkpart else _module_of(base[0], [a.name for a in node.names])
            else:
                continue
            for dst in targets:
                if dst.startswith("rkpart.") and dst != module:
                    edges[(module, dst)].append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    return edges


def test_modules_form_no_cycle() -> None:
    """No circle between modules either, inside one package or across (a package's ``__init__.py``
    counts as a module: a module that imports its own package's face while the face imports it
    is a circle too)."""
    edges = module_imports()
    g = nx.DiGraph(list(edges))
    cycles = sorted(sorted(nx.simple_cycles(g), key=len)[:20], key=lambda c: (len(c), c))
    lines = [" -> ".join([*c, c[0]]) + "   (" + "; ".join(
        f"{a}: {edges[(a, b)][0]}" for a, b in zip(c, [*c[1:], c[0]], strict=True)) + ")" for c in cycles]
    assert not cycles, "import cycles between rkpart modules:\n" + "\n".join(lines)


def test_the_module_parser_sees_imports_inside_a_package() -> None:
    """Guard for the module check: known imports inside packages are found, function-level ones too."""
    edges = module_imports()
    assert ("rkpart.cost_model.rounds", "rkpart.cost_model.model") in edges
    assert ("rkpart.ir.graph", "rkpart.ir.subgraph") in edges
    assert ("rkpart.cost_model.model", "rkpart.cost_model.checks") in edges  # inside a function
    assert ("rkpart.cost_model.checks", "rkpart.cost_model.features") in edges  # ``from package import module``


def test_the_import_parser_sees_function_level_imports() -> None:
    """Guard for the checks below: a known function-level import is found."""
    edges = package_imports()
    # rkpart/pipeline.py imports the simplifier inside write_plan
    assert any(w.startswith("rkpart/pipeline.py") for w in edges[("pipeline", "runtime")])
    assert ("plan", "grouping") in edges


def test_packages_form_no_cycle() -> None:
    edges = package_imports()
    g = nx.DiGraph(list(edges))
    cycles = sorted(sorted(nx.simple_cycles(g), key=len)[:20], key=lambda c: (len(c), c))
    lines = []
    for c in cycles:
        hops = list(zip(c, [*c[1:], c[0]], strict=True))
        lines.append(" -> ".join([*c, c[0]]) + "   (" + "; ".join(f"{a}->{b}: {edges[(a, b)][0]}" for a, b in hops)
                     + ")")
    assert not cycles, "import cycles between rkpart packages:\n" + "\n".join(lines)


def test_layers_name_only_existing_packages() -> None:
    """A moved or deleted package leaves LAYERS too, so the list stays the package map."""
    stale = sorted(p for layer in LAYERS for p in layer if not _is_package(p))
    assert not stale, f"LAYERS in {__name__} names packages rkpart no longer has: {stale}"


def test_packages_import_only_lower_layers() -> None:
    rank = {p: i for i, layer in enumerate(LAYERS) for p in layer}
    edges = package_imports()
    unknown = sorted({p for e in edges for p in e if p not in rank})
    assert not unknown, f"packages missing from LAYERS in {__name__}: {unknown}; place them in the layer order"
    upward = [f"{a} (layer {rank[a]}) imports {b} (layer {rank[b]}) at {', '.join(where[:3])}"
              for (a, b), where in sorted(edges.items()) if rank[b] > rank[a]]
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


#: the old import paths plugins use (docs/plugins.md), kept as re-exports: rkpart itself never imports them
COMPAT = ("recognizers", "strategies")


def test_rkpart_never_imports_the_paths_kept_for_plugins() -> None:
    edges = package_imports()
    inside = [f"{a} imports {b} at {', '.join(w[:3])}" for (a, b), w in sorted(edges.items())
              if b in COMPAT and a not in COMPAT]
    assert not inside, "rkpart imports a path kept only for plugins:\n" + "\n".join(inside)


#: what a strategy may not reach for: building, measuring, writing a plan, or the pipeline that runs it
NOT_FOR_STRATEGIES = ("rkpart.compile", "rkpart.runtime", "rkpart.profile", "rkpart.triage", "rkpart.plan.write",
                      "rkpart.plan.extract", "rkpart.pipeline", "rkpart.grounding", "rkpart.repartition")


def test_strategies_only_group() -> None:
    """A strategy returns groups: the strategies (``auto`` too) import nothing that compiles, measures,
    writes a plan or runs the pipeline, not even inside a function (``auto``'s builds are
    :mod:`rkpart.grounding`'s, a step of the pipeline)."""
    edges = module_imports()
    strategy = ("rkpart.grouping.strategies", "rkpart.auto")
    bad = [f"{a} imports {b} at {w[0]}" for (a, b), w in sorted(edges.items())
           if a.startswith(strategy) and b.startswith(NOT_FOR_STRATEGIES)]
    assert not bad, "\n".join(bad)

