"""Plans stay byte-identical: the fixed set of :mod:`tests.integrity.golden_plans` hashes as recorded.

Cases over a torch export are in the ``export`` tier; they read the export the family sweep caches.
"""

from __future__ import annotations

import json

import pytest

from tests.integrity.golden_plans import CASES, INPUT, MODELS, RECORD, Case, Golden, entry_for


@pytest.fixture(scope="module")
def recorded() -> dict[str, dict[str, str]]:
    record: dict[str, dict[str, str]] = json.loads(RECORD.read_text())
    names = {c.name for c in CASES}
    exports = {c.name for c in CASES if MODELS[c.model].export}
    assert names <= set(record), "golden_plans.json is stale: regenerate it deliberately"
    # beyond the cases: variants of export cases only (another machine's export, recorded exactly)
    assert {k.partition("@")[0] for k in set(record) - names} <= exports, "golden_plans.json is stale"
    return record


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Golden:
    return Golden(tmp_path_factory.mktemp("golden"))


def _param(case: Case) -> object:
    if not MODELS[case.model].export:
        return pytest.param(case, id=case.name)
    return pytest.param(case, id=case.name, marks=pytest.mark.export)


@pytest.mark.slow  # partitions every recorded golden case
@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_plan_bytes_match_the_record(case: Case, golden: Golden, recorded: dict[str, dict[str, str]]) -> None:
    if MODELS[case.model].export:
        from tests.models.diffusers_families import missing_dependencies

        if missing_dependencies():
            pytest.skip(f"cannot export: {', '.join(missing_dependencies())} missing")
    computed = golden.case(case)
    entry = entry_for(recorded, case.name, computed[INPUT])
    if entry is None and MODELS[case.model].export:
        # an export's bytes depend on the machine (golden_plans.py): a record of other exports says nothing
        pytest.skip(f"{case.model}: this machine's export is none of those recorded for {case.name}; "
                    "record it from a tree whose other plans match: golden_plans.py --add-variants")
    assert entry is not None, f"{case.model}: the model is not the one recorded; regenerate it deliberately"
    assert computed == entry
