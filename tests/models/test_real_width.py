"""Image families at their real width (issue 50): ``docs/real-width.md`` is the rendering of the recorded rows,
and one recorded row is rebuilt as ``scripts/real_width.py`` built it.

The matrix (19 families x 2 toolkits x 2 strategies, minutes to an hour a family) runs whole from
``scripts/real_width.py``; the suite rebuilds its smallest real-width stage: DiT-XL/2's self-attention (16 heads
of 72, 1024 tokens) on 2.5.0, the export cached (``tests.models.real_width.cached_real_export``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("real_width_script", ROOT / "scripts" / "real_width.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_page_is_the_rendering_of_the_recorded_rows() -> None:
    """The page says only what the rows file holds (``scripts/real_width.py --table-only`` rewrites it)."""
    script = _script()
    rows, runs = script.read_rows(script.ROWS)
    assert rows, "no real-width rows recorded"
    assert (ROOT / "docs" / "real-width.md").read_text() == script.render(rows, runs), (
        "docs/real-width.md is stale: run `.venv/bin/python scripts/real_width.py --table-only`")


def test_readme_rows_are_the_rendering_of_the_recorded_rows() -> None:
    """The README's real-width rows (between the markers) say only what the rows file holds."""
    script = _script()
    rows, _ = script.read_rows(script.ROWS)
    text = (ROOT / "README.md").read_text()
    assert script.readme_with(text, script.render_readme(rows)) == text, (
        "README.md's real-width rows are stale: run `.venv/bin/python scripts/real_width.py --table-only`")
    assert "| facebook/DiT-XL-2-512 | 1152 | 16 x 72 |" in text


@pytest.mark.slow  # one fit with its workspace chosen by cross-validation: ~1 s of numpy
def test_shipped_memory_model_is_the_fit_on_the_recorded_rows() -> None:
    """The shipped 2.5.0 device-memory predictor is :func:`fit_memory_model` on the recorded rows (reproducible
    from the repository), and its held-out figures are those of the rows' held-out predictions."""
    from rkpart.cost_model.calibration import shipped_device_memory
    from rkpart.cost_model.device_model import MIN_STAGE_BYTES, error_table, fit_memory_model, held_out_summary

    spec = importlib.util.spec_from_file_location("real_width_fit", ROOT / "bench" / "real_width_memory_fit.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    script = _script()
    rows, _ = script.read_rows(script.ROWS)
    mem = bench.memory_rows(rows, "2.5.0")
    doc = shipped_device_memory()
    assert doc is not None
    shipped = doc["toolkits"]["2.5.0"]
    held = {(r["family"], r["strategy"], r["stage"]): r["heldout_bytes"] for r in rows if r["toolkit"] == "2.5.0"
            and r.get("built")}
    pairs = [(m, float(held[(m.family, m.strategy, m.stage)])) for m in mem]
    model = fit_memory_model(mem, "2.5.0")
    again = held_out_summary(model, pairs, fitted_on=shipped["fit_error"]["fitted_on"],
                             held_out=shipped["fit_error"]["held_out_on"])
    assert again["terms"] == shipped["terms"]
    big = error_table([(m, p) for m, p in pairs if m.device_bytes >= MIN_STAGE_BYTES])
    assert shipped["fit_error"]["held_out"]["n"] == big["n"] >= 40
    assert shipped["fit_error"]["held_out"]["budget_margin"] == big["budget_margin"] > 0


@pytest.mark.toolkit
@pytest.mark.export
@pytest.mark.slow
def test_dit_attention_at_real_width_rebuilds_its_recorded_row(tmp_path: Path) -> None:
    """``partition -s split``, ``estimate`` and ``compile --stage b00.attn`` on 2.5.0, as the script runs them: the
    build places every layer on the NPU, the compiler's weight and internal memory are the recorded row's to the
    byte, its memory features the recorded ones, and the prediction made before compiling within ±10 %."""
    pytest.importorskip("diffusers")
    from rkpart.cli import main
    from tests.models.real_width import cached_real_export

    script = _script()
    rows, _ = script.read_rows(script.ROWS)
    (want,) = [r for r in rows if (r["family"], r["toolkit"], r["strategy"], r["stage"])
               == ("dit", "2.5.0", "split", "b00.attn")]
    plan = tmp_path / "plan"
    cli = CliRunner()
    r = cli.invoke(main, ["partition", str(cached_real_export("dit")), "-o", str(plan), "-s", "split",
                          "--toolkit", "2.5.0", "-q"])
    assert r.exit_code == 0, r.output
    r = cli.invoke(main, ["estimate", str(plan), "--toolkit", "2.5.0", "--json"])
    assert r.exit_code == 0, r.output
    estimate = json.loads(r.stdout)
    r = cli.invoke(main, ["compile", str(plan), "--toolkit", "2.5.0", "--stage", "b00.attn", "-j", "1", "--json"])
    assert r.exit_code == 0, r.output
    (got,) = [g for g in script._stage_rows("dit", "split", "2.5.0", plan, estimate, json.loads(r.stdout))
              if g["stage"] == "b00.attn"]
    assert got["built"] and got["cpu_ops"] == []
    keys = ("weight_bytes", "internal_bytes", "features")
    assert {k: got[k] for k in keys} == {k: want[k] for k in keys}
    err = script._error(got)
    assert err is not None and abs(err) <= script.TOLERANCE, err
