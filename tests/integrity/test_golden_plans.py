"""Plans stay byte-identical: the fixed set of :mod:`tests.integrity.golden_plans` hashes as recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integrity.golden_plans import CASES, RECORD, compute


@pytest.fixture(scope="module")
def computed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    return compute(tmp_path_factory.mktemp("golden"))


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_plan_bytes_match_the_record(case: str, computed: dict[str, dict[str, str]]) -> None:
    recorded = json.loads(Path(RECORD).read_text())
    assert set(recorded) == {c[0] for c in CASES}, "golden_plans.json is stale: regenerate it deliberately"
    assert computed[case] == recorded[case]
