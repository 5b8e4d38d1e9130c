"""``rkpart run PLAN --inputs FILE``: unusable input files give one clean line (issue 8 / issue 2).

Exit code 2 (UserError), the message names the file and the problem, nothing is written
(the plan folder is unchanged and no --save-outputs file appears).
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from rkpart.plan.plan import load_plan
from rkpart.runtime.executor import random_inputs
from tests.hostile.models import assert_user_error, cli, snapshot


@pytest.fixture(scope="session")
def plan_dir(fused_mini_plan: Path) -> Path:
    return fused_mini_plan


@pytest.fixture(scope="module")
def good_feeds(plan_dir: Path) -> dict[str, np.ndarray]:
    plan, _ = load_plan(plan_dir)
    return random_inputs(plan.tensors, plan.inputs, seed=3)


def _run_fails(plan_dir: Path, inputs: Path, tmp_path: Path, *needles: str) -> str:
    before = snapshot(plan_dir)
    saved = tmp_path / "outs.npz"
    r = cli(["run", plan_dir, "--inputs", inputs, "--save-outputs", saved, "-q"])
    msg = assert_user_error(r, 2, *needles)
    assert snapshot(plan_dir) == before
    assert not saved.exists()
    return msg


def test_good_inputs_run(plan_dir: Path, good_feeds: dict[str, np.ndarray], tmp_path: Path) -> None:
    p = tmp_path / "in.npz"
    np.savez(p, **good_feeds)  # type: ignore[arg-type]
    r = cli(["run", plan_dir, "--inputs", p, "-q"])
    assert r.exit_code == 0, r.output


def test_missing_array(plan_dir: Path, good_feeds: dict[str, np.ndarray], tmp_path: Path) -> None:
    p = tmp_path / "in.npz"
    name = sorted(good_feeds)[0]
    np.savez(p, **{k: v for k, v in good_feeds.items() if k != name})  # type: ignore[arg-type]
    _run_fails(plan_dir, p, tmp_path, "in.npz", f"no array {name!r}")


def test_wrong_shape(plan_dir: Path, good_feeds: dict[str, np.ndarray], tmp_path: Path) -> None:
    p = tmp_path / "in.npz"
    name = "hidden_states"
    feeds = dict(good_feeds)
    feeds[name] = np.zeros((2, *feeds[name].shape[1:]), feeds[name].dtype)
    np.savez(p, **feeds)  # type: ignore[arg-type]
    _run_fails(plan_dir, p, tmp_path, repr(name), "shape")


def test_wrong_dtype(plan_dir: Path, good_feeds: dict[str, np.ndarray], tmp_path: Path) -> None:
    p = tmp_path / "in.npz"
    feeds = dict(good_feeds)
    feeds["timestep"] = np.array(["one"])
    np.savez(p, **feeds)  # type: ignore[arg-type]
    _run_fails(plan_dir, p, tmp_path, "'timestep'", "dtype")


def test_not_an_npz(plan_dir: Path, tmp_path: Path) -> None:
    p = tmp_path / "in.npz"
    p.write_text("hidden_states = 1\n")
    _run_fails(plan_dir, p, tmp_path, "in.npz", "not a usable .npz")


def test_npy_instead_of_npz(plan_dir: Path, tmp_path: Path) -> None:
    p = tmp_path / "in.npy"
    np.save(p, np.zeros(3))
    _run_fails(plan_dir, p, tmp_path, "in.npy", "single .npy")


def test_pickled_arrays(plan_dir: Path, good_feeds: dict[str, np.ndarray], tmp_path: Path) -> None:
    p = tmp_path / "in.npz"
    feeds: dict[str, np.ndarray] = dict(good_feeds)
    feeds["timestep"] = np.array([{"evil": 1}], dtype=object)
    np.savez(p, **feeds)  # type: ignore[arg-type]
    _run_fails(plan_dir, p, tmp_path, "in.npz", "pickled")


def test_corrupt_zip_member(plan_dir: Path, good_feeds: dict[str, np.ndarray], tmp_path: Path) -> None:
    buf = io.BytesIO()
    np.savez_compressed(buf, **good_feeds)  # type: ignore[arg-type]
    data = bytearray(buf.getvalue())
    mid = len(data) // 2
    data[mid:mid + 64] = b"\xff" * 64
    p = tmp_path / "in.npz"
    p.write_bytes(bytes(data))
    _run_fails(plan_dir, p, tmp_path, "in.npz")


def test_truncated_npz(plan_dir: Path, good_feeds: dict[str, np.ndarray], tmp_path: Path) -> None:
    buf = io.BytesIO()
    np.savez(buf, **good_feeds)  # type: ignore[arg-type]
    p = tmp_path / "in.npz"
    p.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 3])
    _run_fails(plan_dir, p, tmp_path, "in.npz")


def test_zip_with_garbage_member(plan_dir: Path, tmp_path: Path) -> None:
    p = tmp_path / "in.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("hidden_states.npy", b"not an npy header")
    _run_fails(plan_dir, p, tmp_path, "in.npz")


def test_missing_inputs_file(plan_dir: Path, tmp_path: Path) -> None:
    _run_fails(plan_dir, tmp_path / "nope.npz", tmp_path, "nope.npz", "does not exist")
