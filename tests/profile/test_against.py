"""``rkpart profile --against MODEL.json``: prediction error per component of a profiled plan."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from rkpart.cli import main


@pytest.mark.slow
def test_profile_against_compares_only_a_model_of_the_profiled_device(tmp_path, plans):
    _, folder = plans["split"]
    out = tmp_path / "p.jsonl"
    from rkpart.cost_model.model import default_model_path

    # the shipped model is the board's: an ONNX Runtime profile on x86 is not compared with it
    # (its "error" would be the devices' difference, up to 398,345 % in issue 53)
    res = CliRunner().invoke(main, ["profile", str(folder), "--rounds", "1", "--warmup", "0", "-q", "-o", str(out),
                                    "--against", str(default_model_path())])
    assert res.exit_code == 0, res.output
    assert "vs measured" not in res.output
    assert "not compared" in res.output and "measured on ort" in res.output
    # a model fitted on this device's profiles is compared, per component
    fitted = tmp_path / "m.json"
    res = CliRunner().invoke(main, ["fit", str(out), "-o", str(fitted)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["profile", "--show", str(out), "--against", str(fitted)])
    assert res.exit_code == 0, res.output
    assert "vs measured" in res.output
    rows = [ln for ln in res.output.splitlines() if ln.startswith("total ")]
    comps = {ln.split()[1] for ln in rows}
    assert {"load", "init", "infer", "release", "host"} <= comps
    for ln in rows:
        assert re.search(r"[-+]\d+(\.\d+)? %$", ln) or ln.rstrip().endswith("-"), ln


def test_against_with_compare_is_a_usage_error(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text("")
    res = CliRunner().invoke(main, ["profile", "--compare", str(a), str(a), "--against", str(a)])
    assert res.exit_code == 2 and "--against goes with" in res.output
