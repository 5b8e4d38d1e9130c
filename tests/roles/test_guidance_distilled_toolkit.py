"""The guidance-distilled case through the toolkit: ``rkpart bundle`` records the roles from the
plan's ``pipeline.json`` in the manifest's ``denoise`` record, the board runner's ``--steps`` loop
(NPU stages on its ONNX Runtime stand-in) feeds them as drift does and writes a finite latent
near drift's (the runner steps the pipeline's own scheduler), and ``rkpart drift`` in the
rknn-toolkit2 simulator gives finite rows.  The
plan without a description bundles without a loop, and the runner refuses ``--steps`` in one line.

The model is :mod:`tests.models.guidance_distilled` (Flux, ``guidance_embeds=True``), fused,
compiled for real by rknn-toolkit2 2.3.0.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from rkpart.bundle.build import bundle_plan
from rkpart.cli import main
from rkpart.compile.compile import CompileOptions, compile_plan_report
from rkpart.pipeline import partition
from rkpart.plan.plan import Plan
from rkpart.profile.drift import denoise
from tests.bundle.test_bundle import run_cli
from tests.description.docs import flux_ids
from tests.export.loop import cosine
from tests.models.guidance_distilled import flux_guidance_description, flux_guidance_export
from tests.toolkits import get_toolkit

pytestmark = [pytest.mark.toolkit, pytest.mark.export, pytest.mark.slow]

STEPS = 3


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Plan, Path]]:
    root = tmp_path_factory.mktemp("guidance-tk")
    out = {}
    for name in ("described", "bare"):
        (root / name).mkdir()
        shutil.copy(flux_guidance_export(), root / name / "transformer.onnx")
        if name == "described":
            flux_guidance_description(root / name)
        folder = root / f"{name}-plan"
        plan = partition(root / name / "transformer.onnx", folder, "fused")
        rep = compile_plan_report(plan, folder, CompileOptions(get_toolkit("2.3.0"), "rk3588", {}, jobs=2))
        assert not rep.failed
        out[name] = (rep.plan, folder)
    return out


def test_bundle_records_the_roles_and_the_runner_loop_equals_drift(compiled: dict[str, tuple[Plan, Path]],
                                                                   tmp_path: Path) -> None:
    plan, folder = compiled["described"]
    r = CliRunner().invoke(main, ["bundle", str(folder), "-o", str(tmp_path / "board"), "--json", "-q"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["denoise"]
    assert (d["latent"], d["timestep"], d["guidance_input"], d["cfg_mode"], d["mapped_by"]) == (
        "hidden_states", "timestep", "guidance", "distilled", "pipeline.json")
    assert d["roles"]["img_ids"] == "image_ids" and d["roles"]["guidance"] == "guidance"
    assert d["context"] == ["encoder_hidden_states", "pooled_projections"]
    assert d["guidance"] == 3.5 and d["scheduler"]["timestep_scale"] == pytest.approx(1.0)
    assert d["fixed"] == {"file": "loop_inputs.npz", "inputs": ["img_ids", "txt_ids"]}
    with np.load(tmp_path / "board" / "loop_inputs.npz") as z:
        assert np.array_equal(z["img_ids"], flux_ids()["img_ids"]) and not z["txt_ids"].any()
    ref = denoise(plan, folder, backend=None, steps=STEPS, cfg=True).latents[-1]
    p = run_cli(tmp_path / "board", "--steps", str(STEPS), "--latent-out", str(tmp_path / "x.npy"), "--json",
                standin=folder)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["passes_per_step"] == 1  # distilled: one call per step, without --no-cfg
    x = np.load(tmp_path / "x.npy")
    # the runner steps the pipeline's own scheduler (issue 49: FlowMatchEuler with the recorded sigmas
    # and shift, checked against diffusers in tests/board), drift its plain flow-Euler: the same roles
    # and inputs give nearby latents, not equal ones (guidance fed as the timestep gives NaN or noise)
    assert np.isfinite(x).all() and x.shape == ref.shape
    assert cosine(x, ref) >= 0.99, cosine(x, ref)


def test_without_a_description_the_bundle_has_no_loop_and_the_runner_says_why(
        compiled: dict[str, tuple[Plan, Path]], tmp_path: Path) -> None:
    _plan, folder = compiled["bare"]
    res = bundle_plan(folder, tmp_path / "board")
    assert "2 inputs fit the timestep" in res.manifest["denoise"]["error"]
    p = run_cli(tmp_path / "board", "--steps", "2", "--latent-out", str(tmp_path / "x.npy"), standin=folder)
    assert p.returncode == 2
    line = p.stderr.strip()
    assert "\n" not in line and "cannot run a denoising loop: 2 inputs fit the timestep" in line
    assert "--guidance-input NAME" in line
    assert not (tmp_path / "board" / "latent.npy").exists()


def test_drift_in_the_simulator_is_finite(compiled: dict[str, tuple[Plan, Path]]) -> None:
    _plan, folder = compiled["described"]
    r = CliRunner().invoke(main, ["drift", str(folder), "--toolkit", "2.3.0", "--steps", "2", "--json", "-q"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["rows"]
    assert rows and all(row["nonfinite"] == 0 and row["cosine"] > 0.99 for row in rows)
    assert {row["kind"] for row in rows} == {"cond", "latent"}  # distilled: no unconditional pass
