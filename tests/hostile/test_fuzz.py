"""Fuzzing: mutated models never make rkpart fail uncontrolled or leave partial output.

Every case runs ``rkpart partition`` in-process (CliRunner) on a mutated copy of a valid
model and asserts: exit 0 with a loadable plan, or a documented user-error exit code with one
clean line on stderr; never an uncaught exception; on failure nothing is written (neither
the output folder nor any staging sibling).  The profile is derandomized so CI runs the
same cases every time; the case count is printed in the terminal summary ("rkpart fuzz").
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rkpart.partitioner.plan import load_plan
from tests.hostile.models import FUZZ_STATS, USER_EXIT_CODES, cli, mlp, siblings
from tests.hostile.mutations import mutate_bytes, mutate_structure

pytestmark = pytest.mark.slow  # 1000 cases; tests/hostile/test_models.py keeps the hand-made ones fast

FUZZ = settings(
    derandomize=True,  # reproducible in CI: the same cases every run
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                           HealthCheck.data_too_large],
)


def _check_partition(model_bytes: bytes, strategy: str, what: str, test: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="rkfuzz-"))
    try:
        model = work / "model.onnx"
        model.write_bytes(model_bytes)
        out = work / "out"
        r = cli(["partition", model, "-o", out, "-s", strategy, "-q"])
        FUZZ_STATS[f"cases:{test}"] += 1
        FUZZ_STATS[f"exit:{r.exit_code}"] += 1
        assert r.exception is None or isinstance(r.exception, SystemExit), (
            f"{what}: uncontrolled {type(r.exception).__name__}: {r.exception}"
        )
        if r.exit_code == 0:
            load_plan(out)
            return
        assert r.exit_code in USER_EXIT_CODES, f"{what}: exit {r.exit_code}: {r.stderr!r}"
        assert "Traceback" not in r.stderr, what
        errs = [ln for ln in r.stderr.splitlines() if ln.startswith("rkpart: error:")]
        assert len(errs) == 1 and len(r.stderr.strip().splitlines()) == 1, f"{what}: {r.stderr!r}"
        assert not out.exists(), f"{what}: output written on failure"
        assert siblings(out) == [], f"{what}: left {siblings(out)}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


_SEEDS: dict[str, bytes] = {}


@pytest.fixture(scope="module")
def seeds(mini_model: Path, bundled: Path) -> None:
    """Fill the module-level seed table (kept out of the test's arguments: hypothesis would
    print megabytes of model bytes in every failure report)."""
    _SEEDS.update(mini=mini_model.read_bytes(), mlp=mlp().SerializeToString(), bundled=bundled.read_bytes())


@settings(FUZZ, max_examples=400)
@given(data=st.data())
@pytest.mark.usefixtures("seeds")
def test_fuzz_bytes(data: st.DataObject) -> None:
    """Byte flips, overwrites, insertions, deletions and truncations of serialized models."""
    name = data.draw(st.sampled_from(["mini", "mini", "mini", "mlp", "bundled"]), label="seed")
    mutated, what = mutate_bytes(data.draw, _SEEDS[name])
    strategy = data.draw(st.sampled_from(["fused", "split"]), label="strategy")
    _check_partition(mutated, strategy, f"{name}: {what}", "bytes")


@settings(FUZZ, max_examples=600)
@given(data=st.data())
@pytest.mark.usefixtures("seeds")
def test_fuzz_structure(data: st.DataObject) -> None:
    """Structured ModelProto edits: dropped/rewired nodes, dims, dtypes, attributes, names, cycles."""
    name = data.draw(st.sampled_from(["mini", "mini", "mini", "mlp", "bundled"]), label="seed")
    m = onnx.ModelProto.FromString(_SEEDS[name])
    what = mutate_structure(data.draw, m)
    strategy = data.draw(st.sampled_from(["fused", "split"]), label="strategy")
    _check_partition(m.SerializeToString(), strategy, f"{name}: {what}", "structure")
