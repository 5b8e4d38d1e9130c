"""docs/npu-stages.md's table of the whole diffusers sweep is what ``scripts/npu_table.py --pivot`` makes of the
recorded runs, and those runs cover every family of the sweep with 0 CPU layers.

``docs/npu-table/latest.md`` holds the rows ``scripts/npu_table.py`` wrote (one run per family and
toolkit, each on an empty ``$RKPART_CACHE_DIR``; docs/npu-stages.md "The 42 families of the whole sweep"
says how).  A table edited by hand, a run left out or a row left with a CPU layer fails here.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from tests.models.diffusers_families import EXPORTERS, LATEST
from tests.partitioner.test_family_sweep import CI_LATEST, EXPORT_FAILS, LOAD_FAILS

ROOT = Path(__file__).resolve().parents[2]
#: the page of the NPU tables (the README links to it)
PAGE = ROOT / "docs" / "npu-stages.md"
RAW = ROOT / "docs" / "npu-table" / "latest.md"
#: the plans of each family: split on both toolkits, fused on 2.5.0
PLANS = (("split", "2.5.0"), ("fused", "2.5.0"), ("split", "2.3.0"), ("fused", "2.3.0"))
#: each family's other export (the one CI does not sweep), where the exporter makes one ONNX Runtime loads
OTHER = {(f, x) for f, e in CI_LATEST for x in EXPORTERS
         if x != e and (f, x) not in EXPORT_FAILS and (f, x) not in LOAD_FAILS}
#: plans the table leaves out, with why (docs/npu-stages.md says so too); RFD4's TorchScript ``fused`` plan on 2.5.0 was
#: here until 2026-12-06 (its block stages hung 2.5.0's optimiser: ``rms-norm-contiguous``)
NOT_RUN: dict[tuple[str, str, str, str], str] = {}
#: rows recorded with a stage unbuilt or CPU layers left, with why (docs/npu-stages.md says so too); a row listed
#: here that reaches every stage built and 0 CPU layers fails the test, so the list shrinks as gaps close (Sana-WM's two
#: 2.3.0 split rows closed on 2026-12-06: reduce-sum-matmul, slice-reverse, concat-constant-per-reader)
GAPS: dict[tuple[str, str, str, str], str] = {}


def _npu_table():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("npu_table", ROOT / "scripts" / "npu_table.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows() -> list[dict[str, str]]:
    return [r for r, _ in _npu_table().read_table(RAW, strict=True)[1]]


def _plan(r: dict[str, str]) -> tuple[str, str, str, str]:
    """The plan a table or gate row is of: (family, exporter, strategy, toolkit)."""
    return r["family"], r["exporter"], r["strategy"], r["toolkit"]


def _clean(r: dict[str, str]) -> bool:
    """A table row with every NPU stage built and 0 CPU layers left (after any ``--repartition`` rounds)."""
    built = re.match(r"(\d+)/(\d+)", r["built (rewrites)"])
    assert built, r
    return built.group(1) == built.group(2) and re.fullmatch(r"0( \(.*\))?", r["CPU layers (rewrites)"]) is not None


#: the paragraph of :data:`PAGE` the table follows (the newer families' table above it has the same header)
SECTION = "**The 42 families of the whole sweep**"


def _readme_table() -> str:
    """The first table after :data:`SECTION`, from its header to the blank line after it."""
    text = PAGE.read_text()
    start = text.index("\n| family |", text.index(SECTION)) + 1
    end = text.index("\n\n", start)
    return text[start:end + 1]


def test_sweep_table_is_the_pivot_of_the_recorded_runs() -> None:
    assert _readme_table() == _npu_table().pivot([RAW])


def test_recorded_runs_cover_every_family_with_every_stage_built_and_no_cpu_layer() -> None:
    rows = _rows()
    got = {_plan(r) for r in rows}
    want = {(f, e, s, v) for f, e in CI_LATEST | OTHER for s, v in PLANS} - set(NOT_RUN)
    assert len(CI_LATEST) == len(LATEST)
    assert got == want, (sorted(want - got), sorted(got - want))
    gaps = {_plan(r) for r in rows if not _clean(r)}
    assert gaps == {k for k in GAPS if k in got}, (sorted(gaps - set(GAPS)), sorted(set(GAPS) - gaps))


GATES = ROOT / "docs" / "npu-table" / "gate.md"


def test_recorded_gates_pass_on_the_recorded_builds() -> None:
    """``scripts/npu_table.py --gate`` rows (docs/npu-table/gate.md): every plan of the sweep is there, and
    each plan run in the simulator passed against its reference, on the build the table records (the
    same stages built)."""
    _, gates = _npu_table().read_table(GATES, strict=True)
    assert gates
    table = {_plan(r): r for r in _rows()}
    gated = {_plan(g) for g, _ in gates}
    assert set(table) <= gated, sorted(set(table) - gated)  # every plan of the table went through the gate
    for g, line in gates:
        assert re.fullmatch(r"(onnxruntime|torch|stages): pass", g["reference"]), line
        assert float(g["lowest cosine"]) >= 0.999 and int(g["compared"]) >= 1, line
        r = table.get(_plan(g))
        if r is not None:  # a plan of the 42-family sweep (the others are the page's earlier tables)
            assert r["built (rewrites)"].split()[0] == g["stages built"], (line, r)


ANON = ROOT / "docs" / "npu-table" / "anonymised.md"
ANON_TAG = " (anonymised)"
#: the toolkits every plan's anonymised copy was compiled on (scripts/npu_table.py --anonymised), with as many
#: stages built as the named plan; rows of another toolkit (2.3.0: the 42 families' plans) are checked for
#: every stage built, 0 CPU layers and a passed gate
ANON_TOOLKITS = ("2.5.0",)


def _named(r: dict[str, str]) -> tuple[str, str, str, str]:
    """The named plan an anonymised row (exporter ``<exporter> (anonymised)``) was made again from."""
    family, exporter, strategy, toolkit = _plan(r)
    return family, exporter.removesuffix(ANON_TAG), strategy, toolkit


def test_anonymised_copies_build_every_stage_with_no_cpu_layer_and_pass_the_gate() -> None:
    """``docs/npu-table/anonymised.md``: every plan of docs/npu-stages.md's three NPU tables on :data:`ANON_TOOLKITS`
    (and some on other toolkits) made again from the export's anonymised copy (every node and tensor
    renamed, no metadata: the blocks found from structure alone; ``scripts/npu_table.py --anonymised``):
    every NPU stage built with 0 CPU layers, and the rknn-sim gate passed (gate.md), on :data:`ANON_TOOLKITS`
    with as many stages as the named export's plan."""
    _, gates = _npu_table().read_table(GATES, strict=True)
    named = {_plan(g): g for g, _ in gates if not g["exporter"].endswith(ANON_TAG)}
    anon_gates = {_named(g): g for g, _ in gates if g["exporter"].endswith(ANON_TAG)}
    _, table = _npu_table().read_table(ANON, strict=True)
    assert all(r["exporter"].endswith(ANON_TAG) for r, _ in table)
    anon = {_named(r): r for r, _ in table}
    unmade = {(f, e) for f, e, _, v in anon if v == "-"}  # rows of exports that cannot be made or loaded
    assert unmade <= set(EXPORT_FAILS) | set(LOAD_FAILS), sorted(unmade)
    anon = {k: r for k, r in anon.items() if k[3] != "-"}
    want = {k for k in named if k[3] in ANON_TOOLKITS}
    got = {k for k in anon if k[3] in ANON_TOOLKITS}
    assert got == want, (sorted(want - got), sorted(got - want))
    assert set(anon) <= set(named), sorted(set(anon) - set(named))  # other toolkits: the plans run so far
    sweep_230 = {_plan(r) for r in _rows() if r["toolkit"] == "2.3.0"}
    assert sweep_230 <= set(anon), sorted(sweep_230 - set(anon))  # the 42 families on 2.3.0 too
    for key, r in anon.items():
        assert _clean(r), (key, r)
        g = anon_gates.get(key)
        assert g is not None and g["stages built"] == r["built (rewrites)"].split()[0], (key, g, r)
        if key[3] in ANON_TOOLKITS:  # as many stages as the named plan (on 2.3.0 the rounds differ: the page)
            assert g["stages built"] == named[key]["stages built"], (key, g, named[key])


def _earlier_tables() -> dict[tuple[str, str, str, str], str]:
    """(family, exporter, strategy, toolkit) -> cell, for the two NPU tables of :data:`PAGE` before the
    42-family one (the 12 first families, and the 16 newer ones): "stages built; CPU layers", or
    "before -> after" of each."""
    text = PAGE.read_text()
    part = text[text.index("# NPU stages per family"):text.index(SECTION)]
    cells: dict[tuple[str, str, str, str], str] = {}
    for line in part.splitlines():
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(c) == 6 and c[1] in EXPORTERS and re.fullmatch(r"\d+\.\d+\.\d+", c[2]):
            for strategy, cell in (("split", c[3]), ("fused", c[4])):
                if cell:
                    cells[(c[0], c[1], strategy, c[2])] = cell
    return cells


def test_every_plan_of_the_earlier_tables_passed_the_gate() -> None:
    """The 12 first families' and the 16 newer families' plans (both exporters, split and fused, 2.5.0 and
    2.3.0) are in gate.md too, each passed, with as many stages built as the table says where it says
    every stage built (Flux.3 dynamo ``fused`` on 2.3.0 builds 2 of 6 without ``--repartition``; its
    gate row is the ``--repartition`` plan's)."""
    cells = _earlier_tables()
    assert len(cells) == 96 + 124, len(cells)
    _, gates = _npu_table().read_table(GATES, strict=True)
    by_plan = {_plan(g): g for g, _ in gates}
    assert set(cells) <= set(by_plan), sorted(set(cells) - set(by_plan))
    for key, cell in cells.items():
        after = re.findall(r"(\d+)/(\d+)", cell.split(";")[0])[-1]
        if after[0] == after[1]:
            assert by_plan[key]["stages built"] == "/".join(after), (key, cell, by_plan[key])
