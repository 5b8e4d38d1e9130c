"""`rkpart inspect` and `rkpart partition` say when stages will be lowered (a real dynamo export, opset 20)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from rkpart.cli import main
from rkpart.cli_args import bundled_example
from tests.models.diffusers_families import cached_export, missing_dependencies

pytestmark = [pytest.mark.export,
              pytest.mark.skipif(bool(missing_dependencies()), reason=f"not installed: {missing_dependencies()}")]

NOTE = "note: stages will be lowered from opset 20 to 19 for rknn-toolkit2 2.3.0, 2.3.2"


def test_inspect_and_partition_say_stages_will_be_lowered(tmp_path: Path) -> None:
    model = cached_export("flux", "dynamo")
    r = CliRunner().invoke(main, ["inspect", str(model)])
    assert r.exit_code == 0 and NOTE in r.output, r.output
    r = CliRunner().invoke(main, ["partition", str(model), "-o", str(tmp_path / "plan"), "-q"])
    assert r.exit_code == 0 and NOTE in r.output, r.output
    r = CliRunner().invoke(main, ["inspect", str(bundled_example())])  # opset 17: nothing to lower
    assert r.exit_code == 0 and "lowered" not in r.output
