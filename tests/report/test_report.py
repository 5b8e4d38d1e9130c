"""``rkpart report``: the page, its PNG plots and CSV tables, and the page in a real headless chromium."""

from __future__ import annotations

import csv
import html
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from rkpart.cli import main
from rkpart.cost_model.calibration import fit_profiles
from rkpart.output import MARKER
from rkpart.plan.plan import Plan
from rkpart.profile import records as rec
from rkpart.profile.lifecycle import ProfileOptions, profile_plan
from rkpart.report.build import build_report
from rkpart.runtime.ort import OrtBackend
from rkpart.runtime.validate import validate_plan_run

# outside the fast tier: builds whole report pages (the fast tier stays under a minute of CPU)
pytestmark = pytest.mark.slow

pytest.importorskip("matplotlib")

PNGS = {"stage_map.png", "lifecycle.png", "memory.png", "accuracy.png", "cost_model.png"}
CSVS = {"measured.csv", "stages.csv", "coverage.csv", "compile.csv", "lifecycle.csv", "memory.csv", "accuracy.csv",
        "cost_model.csv"}


@pytest.fixture(scope="module")
def inputs(plans: dict[str, tuple[Plan, Path]], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real ONNX Runtime profiles of the split and fused example plans and a per-stage run report."""
    d = tmp_path_factory.mktemp("report-inputs")
    out: dict[str, Path] = {}
    for name in ("split", "fused"):
        plan, folder = plans[name]
        records = profile_plan(plan, folder, ProfileOptions(rounds=2, warmup=1, cfg=True, sample_interval=0.05,
                                                            plan=str(folder)), backend=OrtBackend(threads=1)).to_json()
        out[name] = rec.write_jsonl(d / f"{name}.jsonl", records)
    run = validate_plan_run(plans["split"][1], per_stage=True)
    out["run"] = d / "run.json"
    out["run"].write_text(json.dumps(run.to_json()))
    # a cost model of the same device as the profiles: fitted on them (ONNX Runtime on this machine)
    model, _ = fit_profiles([out["split"], out["fused"]])
    out["ort_model"] = model.save(d / "ort_fit.json")
    return out


def _report(page: Path, plan: Path, inputs: dict[str, Path], cost_model: str) -> Path:
    r = CliRunner().invoke(main, ["report", str(plan), str(inputs["split"]), str(inputs["fused"]),
                                  "--run", str(inputs["run"]), "--cost-model", cost_model, "--budget-mib", "64",
                                  "-o", str(page), "-q"])
    assert r.exit_code == 0, r.output
    return page


@pytest.fixture(scope="module")
def report(plans: dict[str, tuple[Plan, Path]], inputs: dict[str, Path],
           tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page with the cost model fitted on the profiles' own device (ONNX Runtime)."""
    return _report(tmp_path_factory.mktemp("report") / "report.html", plans["split"][1], inputs,
                   str(inputs["ort_model"]))


@pytest.fixture(scope="module")
def board_model_report(plans: dict[str, tuple[Plan, Path]], inputs: dict[str, Path],
                       tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page with the shipped board calibration against the same ONNX Runtime profiles."""
    return _report(tmp_path_factory.mktemp("board") / "report.html", plans["split"][1], inputs, "shipped")


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_page_is_self_contained_with_every_section(report: Path) -> None:
    text = report.read_text()
    assert "<script" not in text.lower()
    assert not re.search(r"""(?:src|href)\s*=\s*['"]?(?:https?:)?//""", text), "no network references"
    assert len(re.findall(r"src='data:image/png;base64,", text)) == len(PNGS)
    for title in ("What was measured", "Stage map", "Compile outcomes", "Lifecycle latency per block",
                  "Memory timeline", "Per-stage accuracy", "Cost model"):
        assert f"<h2>{title}</h2>" in text, title


def test_plots_and_tables_are_files_too(report: Path, plans: dict[str, tuple[Plan, Path]]) -> None:
    assets = report.with_name("report_files")
    assert {p.name for p in assets.iterdir()} == PNGS | CSVS | {MARKER}  # the marker: rkpart wrote the folder
    assert all((assets / p).read_bytes().startswith(b"\x89PNG") for p in PNGS)
    plan = plans["split"][0]
    cov = {r["row"]: r for r in read_csv(assets / "coverage.csv")}
    assert int(cov["all"]["npu_stages"]) == len(plan.npu_stages) == 6
    assert 0 < float(cov["all"]["npu_ops_share"]) < 1 and float(cov["all"]["npu_matmul_share"]) == 1
    life = read_csv(assets / "lifecycle.csv")
    assert {(r["profile"], r["block"]) for r in life} == {(p, b) for p in ("split", "fused") for b in ("0", "1")}
    assert all(float(r["infer_s"]) > 0 for r in life)
    acc = read_csv(assets / "accuracy.csv")
    assert {r["stage"] for r in acc} == {s.id for s in plan.npu_stages} | {"end-to-end"}
    assert all(float(r["cosine"]) > 0.999999 for r in acc)
    mem = read_csv(assets / "memory.csv")
    assert {r["profile"] for r in mem} == {"split", "fused"} and all(int(r["pss_peak_kib"]) > 0 for r in mem)
    comp = read_csv(assets / "compile.csv")
    assert [r["status"] for r in comp] == ["not compiled"] * 6
    # no build, no compiler figures: empty, never 0
    assert all(r["weight_bytes"] == r["internal_bytes"] == r["cycles_total"] == "" for r in comp)
    cost = read_csv(assets / "cost_model.csv")
    assert {"infer", "init"} <= {r["component"] for r in cost} and all(float(r["predicted"]) > 0 for r in cost)
    measured = read_csv(assets / "measured.csv")
    assert [(r["profile"], r["backend"]) for r in measured] == [("split", "ort"), ("fused", "ort")]
    assert all(r["toolkit"] == "none (no .rknn ran)" and "x86_64" in r["machine"] for r in measured)


def test_same_inputs_give_byte_identical_files(report: Path, plans: dict[str, tuple[Plan, Path]],
                                               inputs: dict[str, Path], tmp_path: Path) -> None:
    again = build_report(plans["split"][1], [inputs["split"], inputs["fused"]], tmp_path / "report.html",
                         runs=[inputs["run"]], cost_model=str(inputs["ort_model"]), budget_mib=64)
    a, b = report.with_name("report_files"), again.assets
    for name in PNGS | CSVS:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("extra,code,message", [
    (["-o", "{dir}/r.txt"], 2, "should end in .html"),
    (["{dir}/missing.jsonl"], 5, "does not exist"),
    (["--cost-model", "shipped"], 2, "give profile files too"),
])
def test_bad_input_is_one_line(plans: dict[str, tuple[Plan, Path]], tmp_path: Path, extra: list[str], code: int,
                               message: str) -> None:
    args = [a.replace("{dir}", str(tmp_path)) for a in extra]
    if "-o" not in args:
        args += ["-o", str(tmp_path / "r.html")]
    r = CliRunner().invoke(main, ["report", str(plans["split"][1]), *args, "-q"])
    assert r.exit_code == code and message in r.output and "Traceback" not in r.output
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "r_files").exists()


def test_existing_report_needs_force(report: Path, plans: dict[str, tuple[Plan, Path]]) -> None:
    r = CliRunner().invoke(main, ["report", str(plans["split"][1]), "-o", str(report), "-q"])
    assert r.exit_code == 6 and "use --force" in r.output


def chromium() -> str:
    """Debian's chromium, installed with apt-get when missing (the test set-up), else skip."""
    exe = shutil.which("chromium")
    if exe is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], env=env, capture_output=True, timeout=1200)
        exe = shutil.which("chromium")
    if exe is None:
        pytest.skip("chromium is not installed and cannot be installed here (apt-get install chromium)")
    return exe


def screenshot(exe: str, page: Path, png: Path) -> str:
    p = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                        "--window-size=1280,4000", f"--screenshot={png}", page.as_uri()],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stderr


def console_messages(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ":CONSOLE" in ln or "net::ERR" in ln]


@pytest.mark.slow
def test_page_renders_in_headless_chromium_without_console_errors(report: Path, tmp_path: Path) -> None:
    exe = chromium()
    # the check can fail: a page that logs an error is caught
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('boom')</script></body></html>")
    assert any("boom" in m for m in console_messages(screenshot(exe, bad, tmp_path / "bad.png")))
    shot = tmp_path / "report.png"
    assert console_messages(screenshot(exe, report, shot)) == []
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG")
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1280, 4000)
    assert len(data) > 100_000  # a rendered page with plots, not a blank one


# -- what was measured, and on which device (issue 53) ------------------------------------------------


def test_a_board_calibration_is_not_compared_with_onnx_runtime_profiles(board_model_report: Path) -> None:
    """The shipped calibration is the board's; these profiles are ONNX Runtime's on x86: no error rows
    (before: up to 346 280 % "errors", the gap between two devices), and the page says why."""
    text = board_model_report.read_text()
    assets = board_model_report.with_name("report_files")
    assert read_csv(assets / "cost_model.csv") == []
    assert not (assets / "cost_model.png").exists()
    for name in ("split", "fused"):
        assert (f"Not compared: {name} (measured on ort: ONNX Runtime on the host CPU: the stages&#x27; .onnx files, "
                f"no NPU) is not compared with the shipped calibration, which is for rknnlite") in text
    assert "the shipped calibration: measured on rknnlite (Radxa ROCK 5C" in text


def test_coverage_figures_are_named_as_partition_prints_them(report: Path, plans: dict[str, tuple[Plan, Path]],
                                                             example_model: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["partition", str(example_model), "--strategy", "split", "--out",
                                  str(tmp_path / "p"), "-q"])
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if ln.startswith("on the NPU: "))
    assert re.fullmatch(r"on the NPU: 100\.0 % of the blocks' matmul work \(MACs\), \d+\.\d % of the weight bytes, "
                        r"\d+\.\d % of the ops", line), line
    assert html.escape(line) in report.read_text()  # the page says the same, in the same words


class _Dom(HTMLParser):
    """What a test reads of a rendered page: the backend lines, and the rows of the cost-model table."""

    def __init__(self) -> None:
        super().__init__()
        self.section: str | None = None
        self.in_backend = False
        self.backend: list[str] = []
        self.cell: list[str] | None = None
        self.row: list[str] | None = None
        self.cost_rows: list[list[str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "section":
            self.section = a.get("id")
        elif tag == "p" and a.get("class") == "backend":
            self.in_backend = True
            self.backend.append("")
        elif tag == "tr" and self.section == "cost_model":
            self.row = []
        elif tag == "td" and self.row is not None:
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "p":
            self.in_backend = False
        elif tag == "td" and self.cell is not None and self.row is not None:
            self.row.append("".join(self.cell))
            self.cell = None
        elif tag == "tr" and self.row is not None:
            if self.row:
                self.cost_rows.append(self.row)
            self.row = None

    def handle_data(self, data: str) -> None:
        if self.in_backend:
            self.backend[-1] += data
        if self.cell is not None:
            self.cell.append(data)


def dump_dom(exe: str, page: Path, profile_dir: Path) -> _Dom:
    """The page as headless chromium renders it (its DOM after loading), parsed."""
    p = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--no-first-run", f"--user-data-dir={profile_dir}",
                        "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "</html>" in p.stdout, p.stderr[-2000:]
    dom = _Dom()
    dom.feed(p.stdout)
    return dom


@pytest.mark.slow
def test_page_in_chromium_names_each_profiles_backend_and_compares_only_its_device(
        report: Path, board_model_report: Path, tmp_path: Path) -> None:
    exe = chromium()
    for page, rows in ((report, True), (board_model_report, False)):
        dom = dump_dom(exe, page, tmp_path / page.parent.name)
        assert len(dom.backend) == 2, dom.backend  # one line per profile, before any number measured with it
        for name, line in zip(("split", "fused"), dom.backend, strict=True):
            assert line.startswith(f"Profile {name}: backend ort (onnxruntime ")
            assert "ONNX Runtime on the host CPU" in line and "machine: x86_64" in line
            assert line.endswith("toolkit: none (no .rknn ran).")
        # the cost-model table: rows only of profiles measured where the model was (ONNX Runtime here)
        assert bool(dom.cost_rows) == rows
        assert {r[0] for r in dom.cost_rows} <= {"split", "fused"}
