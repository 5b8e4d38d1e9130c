"""``rkpart profile --against MODEL.json``: prediction error per component of a profiled plan."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from rkpart.cli import main


@pytest.mark.slow
def test_profile_against_prints_prediction_error(tmp_path, plans):
    _, folder = plans["split"]
    out = tmp_path / "p.jsonl"
    from rkpart.cost_model.model import default_model_path

    res = CliRunner().invoke(main, ["profile", str(folder), "--rounds", "1", "--warmup", "0", "-q", "-o", str(out),
                                    "--against", str(default_model_path())])
    assert res.exit_code == 0, res.output
    assert "vs measured" in res.output
    rows = [ln for ln in res.output.splitlines() if ln.startswith("total ")]
    comps = {ln.split()[1] for ln in rows}
    assert {"load", "init", "infer", "release", "host"} <= comps
    for ln in rows:
        assert re.search(r"[-+]\d+(\.\d+)? %$", ln) or ln.rstrip().endswith("-"), ln
    # --show of the same records gives the same comparison
    res2 = CliRunner().invoke(main, ["profile", "--show", str(out), "--against", str(default_model_path())])
    assert res2.exit_code == 0, res2.output
    assert [ln for ln in res2.output.splitlines() if ln.startswith("total ")] == rows


def test_against_with_compare_is_a_usage_error(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text("")
    res = CliRunner().invoke(main, ["profile", "--compare", str(a), str(a), "--against", str(a)])
    assert res.exit_code == 2 and "--against goes with" in res.output
