"""Assemble ``rkpart report``: the HTML page, its PNG plots and CSV tables.

The page is self-contained: CSS inline, every plot an inline ``data:image/png`` and every
table HTML, no script and no network access.  Next to it, ``<stem>_files/`` holds the same
plots as PNG files and the tables as CSV.  Both are written atomically (the folder through a
staging folder, the page last), so a killed run leaves the previous report.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rkpart import __version__
from rkpart.errors import OutputExistsError, UserError
from rkpart.io import atomic_write_bytes
from rkpart.output import (
    check_folder_target,
    claim_output_file,
    input_problem,
    managing_folder,
    staged_folder,
    write_output_file,
)
from rkpart.plan.plan import load_plan
from rkpart.progress import Progress
from rkpart.report import data as D
from rkpart.report import plots
from rkpart.report.coverage import coverage_figures, describe_coverage

#: what marks a page rkpart wrote (``--force`` replaces only such a page); the assets folder
#: carries the output marker of :mod:`rkpart.output`
GENERATOR = "<meta name='generator' content='rkpart report'>"
ASSETS_KIND = "report assets"
#: the plots (PNG, drawn when their inputs are given) and tables (CSV, always) of a report folder
PLOTS = ("stage_map", "lifecycle", "memory", "accuracy", "cost_model")
TABLES = ("measured", "stages", "coverage", "compile", "lifecycle", "memory", "accuracy", "cost_model")
#: the tables of a report folder written before rkpart's output marker (``measured`` came later)
_LEGACY_TABLES = ("stages", "coverage", "compile", "lifecycle", "memory", "accuracy", "cost_model")


def assets_listing(folder: Path) -> set[str] | str:
    """What a report folder written before rkpart's output marker holds: every table (CSV) and
    no more than the plots (:data:`~rkpart.output.Listing`)."""
    missing = [f"{t}.csv" for t in _LEGACY_TABLES if not (folder / f"{t}.csv").is_file()]
    if missing:
        return f"it lacks {missing[0]}, which every rkpart report folder has"
    return {f"{n}.png" for n in PLOTS} | {f"{t}.csv" for t in TABLES}


def _is_rkpart_page(path: Path) -> bool:
    from rkpart.output import head_bytes

    return GENERATOR.encode() in head_bytes(path, 4096)


@dataclass(frozen=True)
class ReportResult:
    html: Path
    assets: Path
    files: tuple[str, ...]  # names inside ``assets``


def _csv(rows: D.Table) -> bytes:
    if not rows:
        return b""
    buf = io.StringIO()
    cols = list(dict.fromkeys(k for r in rows for k in r))
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: _fmt(r.get(k)) for k in cols})
    return buf.getvalue().encode()


def _fmt(v: object) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else v


def _table_html(rows: D.Table, limit: int = 400) -> str:
    if not rows:
        return "<p class='none'>nothing to show</p>"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "\n".join(
        "<tr>" + "".join(f"<td>{html.escape(str(_fmt(r.get(c))))}</td>" for c in cols) + "</tr>" for r in rows[:limit])
    more = f"<p class='none'>{len(rows) - limit} more rows in the CSV file</p>" if len(rows) > limit else ""
    return f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>{more}"


def _img(png: bytes | None, alt: str) -> str:
    if png is None:
        return ""
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1200px;
color:#222;padding:0 16px}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:32px;border-bottom:1px solid #ddd}
.meta{color:#666;font-size:13px}.none{color:#888;font-style:italic;font-size:13px}
img{max-width:100%;height:auto;display:block;margin:8px 0}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}
th{background:#f4f4f4;position:sticky;top:0}.scroll{max-height:420px;overflow:auto;margin:8px 0}
code{background:#f4f4f4;padding:1px 4px}
"""


def _section(title: str, intro: str, png: bytes | None, rows: D.Table, name: str) -> str:
    return (f"<section id='{name}'><h2>{html.escape(title)}</h2><p>{intro}</p>{_img(png, title)}"
            f"{_table_html(rows)}<p class='meta'>CSV: <code>{name}.csv</code></p></section>")


def build_report(
    plan_path: str | os.PathLike[str],
    profiles: Sequence[str | os.PathLike[str]] = (),
    output: str | os.PathLike[str] = "report.html",
    *,
    runs: Sequence[str | os.PathLike[str]] = (),
    cost_model: str | None = None,
    budget_mib: float | None = None,
    force: bool = False,
    progress: Progress = lambda _m: None,
) -> ReportResult:
    """Write ``output`` (HTML) and ``<stem>_files/`` (PNG + CSV) for the plan at ``plan_path``.

    ``profiles``: ``rkpart profile`` JSON Lines files (any plans; shown side by side).
    ``runs``: ``rkpart run --per-stage --json`` outputs (per-stage errors).  ``cost_model``:
    a model file, or ``"shipped"``, to compare its predictions with the profiles.
    ``budget_mib``: the line in the memory timeline (default: the plan's ``--budget-mib``).
    """
    out = Path(os.path.abspath(output))
    if out.suffix.lower() not in (".html", ".htm"):
        raise UserError(f"report output {output} should end in .html")
    if out.is_dir():
        raise OutputExistsError(f"report output {out} is a folder")
    assets = out.with_name(out.stem + "_files")
    # checked before any work: the page only onto a regular file rkpart wrote, the assets
    # only into a folder rkpart wrote (rkpart.output); again when they are written
    inputs = [plan_path, *profiles, *runs, *([cost_model] if cost_model not in (None, "shipped") else [])]
    claim_output_file(out, what="report output", force=force, owned=_is_rkpart_page, inputs=inputs)
    if input_problem(assets, inputs) is not None or managing_folder(assets) is not None:
        raise OutputExistsError(f"report folder {assets} lies inside one of the report's inputs or a folder rkpart "
                                "manages; write the report elsewhere")
    check_folder_target(assets, kind=ASSETS_KIND, force=force, what="report folder", legacy=assets_listing)
    plan, folder = load_plan(plan_path)
    profs = [D.load_profile(Path(p)) for p in profiles]
    names = [p.name for p in profs]
    for i, p in enumerate(profs):  # same file stems in different folders: keep names apart
        if names.count(p.name) > 1:
            p.name = f"{p.name}#{i + 1}"
    run_results = [D.load_run(Path(r)) for r in runs]
    if cost_model is not None and not profs:
        raise UserError("--cost-model compares predictions with measurements: give profile files too")
    budget = budget_mib if budget_mib is not None else D.budget_of(plan)

    progress("tables")
    measured = D.measured_table(profs)
    stages = D.stage_table(plan)
    coverage = D.coverage_table(plan)
    compiled = D.compile_table(plan)
    life = D.lifecycle_table(profs)
    mem = D.memory_table(profs)
    acc = D.accuracy_table(run_results)
    comparison = D.cost_model_rows(profs, cost_model) if cost_model is not None else None
    cost = comparison.rows if comparison is not None else []

    progress("plots")
    pngs = {  # PLOTS, in order
        "stage_map": plots.stage_map(stages, coverage),
        "lifecycle": plots.lifecycle(life),
        "memory": plots.memory(mem, budget),
        "accuracy": plots.accuracy(acc),
        "cost_model": plots.cost_model(cost),
    }
    tables = {"measured": measured, "stages": stages, "coverage": coverage, "compile": compiled, "lifecycle": life,
              "memory": mem, "accuracy": acc, "cost_model": cost}

    a = coverage[-1]
    prof_desc = ", ".join(f"{html.escape(p.name)} ({html.escape(p.strategy)}, residency "
                          f"{html.escape(str(p.settings.get('residency')))}, {len(D.profile_blocks(p))} blocks, "
                          f"backend {html.escape(p.backend)})"
                          for p in profs) or "none"
    # every profile's backend, machine and toolkit, before any number measured with them
    backend_lines = "".join(
        f"<p class='backend' data-profile='{html.escape(m['profile'])}'>Profile <b>{html.escape(m['profile'])}</b>: "
        f"backend <code>{html.escape(m['backend'])}</code> ({html.escape(m['runtime'] or 'runtime not recorded')}): "
        f"{html.escape(m['what'])}; machine: {html.escape(m['machine'])}; toolkit: {html.escape(m['toolkit'])}.</p>"
        for m in measured)
    cost_intro = "Predicted against measured, per stage and component."
    if comparison is not None:
        cost_intro += (f" Cost model: {html.escape(comparison.model)}; compared only with profiles measured on the "
                       "same backend (a board calibration with board profiles, an ONNX Runtime fit with ONNX "
                       "Runtime profiles).")
        cost_intro += ("" if not comparison.compared else
                       f" Compared: {html.escape(', '.join(comparison.compared))}.")
        cost_intro += "".join(f"</p><p class='not-compared'>Not compared: {html.escape(n)}."
                              for n in comparison.not_compared)
    model_name = html.escape(str(plan.model.get("file", "")))
    hint_prof = "" if profs else "<p class='none'>No profiles given: <code>rkpart profile PLAN -o p.jsonl</code>, " \
                                 "then <code>rkpart report PLAN p.jsonl</code>.</p>"
    hint_run = "" if run_results else ("<p class='none'>No run reports given: <code>rkpart run PLAN --backend "
                                       "rknn-sim --toolkit 2.3.0 --per-stage --json &gt; run.json</code>, then "
                                       "<code>--run run.json</code>.</p>")
    hint_cost = "" if cost else "<p class='none'>Give <code>--cost-model FILE</code> (or <code>shipped</code>) " \
                                "with profiles to compare predictions with measurements.</p>"
    if comparison is not None and not comparison.compared:
        hint_cost = ("<p class='none'>No profile was measured on the model's device: compare a model fitted on "
                     "these profiles (<code>rkpart fit PROFILE -o model.json</code>), or profile on the device the "
                     "model is for.</p>")
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>{GENERATOR}",
        f"<title>rkpart report: {model_name} ({html.escape(str(plan.strategy.get('name')))})</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>rkpart report: {model_name}, strategy {html.escape(str(plan.strategy.get('name')))}</h1>",
        f"<p class='meta'>plan {html.escape(str(folder))}: {len(plan.stages)} stages ({a['npu_stages']} NPU), "
        f"{len(plan.blocks)} blocks; profiles: {prof_desc}; rkpart {__version__}</p>",
        f"<section id='measured'><h2>What was measured</h2>{backend_lines or '<p class=none>No profiles.</p>'}"
        f"{_table_html(measured) if measured else ''}<p class='meta'>CSV: <code>measured.csv</code></p></section>",
        _section("Stage map", "Blocks (rows) and their stages in execution order. Each NPU share names its unit, as "
                 f"<code>rkpart partition</code> prints it: {html.escape(describe_coverage(coverage_figures(plan)))} "
                 "(the matmul work is recorded for the whole plan; per block: ops and weight bytes).",
                 pngs["stage_map"], coverage, "coverage"),
        f"<details><summary>All stages</summary>{_table_html(stages)}<p class='meta'>CSV: <code>stages.csv</code>"
        "</p></details>",
        _section("Compile outcomes", "Per NPU stage: toolkit, precision, size, the compiler's own plan (weight and "
                 "internal memory, cycles, RW bytes, the op types it gives no cycles), ops the toolkit placed on the "
                 "CPU, fallbacks and failures. " + html.escape(D.fp16_range_summary(plan)), None, compiled, "compile"),
        _section("Lifecycle latency per block", "Median per round over measured rounds: load, init, inference and "
                 "release of NPU stages, and host stages, per profile side by side." + hint_prof, pngs["lifecycle"],
                 life, "lifecycle"),
        _section("Memory timeline", "Per measured round: the process's peak PSS and the device-mapped (NPU) memory of "
                 "each stage as it ran" + (f", with the budget of {budget:g} MiB." if budget is not None else ".")
                 + html.escape(plots.memory_rounds_note(mem)) + hint_prof, pngs["memory"], mem, "memory"),
        _section("Per-stage accuracy", "Cosine similarity and max-abs error of each stage against ONNX Runtime on "
                 "the same inputs, and end to end." + hint_run, pngs["accuracy"], acc, "accuracy"),
        _section("Cost model", cost_intro + hint_cost, pngs["cost_model"], cost, "cost_model"),
        "</body></html>\n",
    ]
    page = "\n".join(parts).encode()

    progress(f"writing {out} and {assets.name}/")
    files: list[str] = []
    with staged_folder(assets, kind=ASSETS_KIND, force=force, what="report folder", legacy=assets_listing) as staging:
        for name, png in pngs.items():
            if png is not None:
                atomic_write_bytes(staging / f"{name}.png", png)
                files.append(f"{name}.png")
        for name, rows in tables.items():
            atomic_write_bytes(staging / f"{name}.csv", _csv(rows))
            files.append(f"{name}.csv")
    write_output_file(out, page, force=force, what="report output", owned=_is_rkpart_page)
    return ReportResult(html=out, assets=assets, files=tuple(sorted(files)))
