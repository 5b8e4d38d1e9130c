"""The guidance-distilled case of issue 48, on a real diffusers Flux transformer with
``guidance_embeds=True`` (tiny, seeded; :mod:`tests.models.guidance_distilled`) whose ``timestep``
and ``guidance`` inputs have the same shape and dtype, and a hand-written ``pipeline.json``.

With the description, ``partition`` records it, and drift's loop (ONNX Runtime here; the
simulator and the board runner in :mod:`tests.roles.test_guidance_distilled_toolkit`) feeds
``timestep`` the timestep, ``guidance`` the guidance scale and the id grids the pipeline's values,
one pass per step, and ends with a finite latent.  Without one and without flags, the tie is
refused in one line.  Masks get ones, never noise (Lumina2, whose text mask is a graph input),
and a NaN row names the stage and the inputs that produced it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from rkpart.cli import main
from rkpart.errors import SpecError
from rkpart.pipeline import partition
from rkpart.plan.outdir import plan_folder_problem
from rkpart.plan.plan import Plan, load_plan
from rkpart.profile.drift import denoise, drift, nonfinite_rows
from rkpart.roles import RoleFlags, loop_inputs, plan_description, resolve_roles
from rkpart.runtime.board_runner import flow_sigmas
from rkpart.runtime.executor import PlanExecutor
from rkpart.runtime.ort import OrtBackend
from tests.description.docs import base_doc, edited, flux_ids, write
from tests.models.guidance_distilled import flux_guidance_description, flux_guidance_export

pytestmark = [pytest.mark.export, pytest.mark.slow]

STEPS = 3


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The export twice: beside a pipeline.json (as rkpart export writes it), and alone."""
    src = flux_guidance_export()
    root = tmp_path_factory.mktemp("guidance")
    out = {}
    for name in ("described", "bare"):
        (root / name).mkdir()
        shutil.copy(src, root / name / "transformer.onnx")
        out[name] = root / name / "transformer.onnx"
    flux_guidance_description(root / "described")
    return out


@pytest.fixture(scope="module")
def plans(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Plan, Path]]:
    root = tmp_path_factory.mktemp("guidance-plans")
    out = {}
    for name, model in models.items():
        out[name] = (partition(model, root / name, "fused"), root / name)
    return out


class FedArrays:
    """Records what every ``PlanExecutor.run_passes`` call is fed (the real method still runs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[list[dict[str, np.ndarray]]] = []
        real = PlanExecutor.run_passes

        def spy(ex: PlanExecutor, feeds: Sequence[Mapping[str, np.ndarray]], **kw: Any) -> Any:
            self.calls.append([{k: np.array(v) for k, v in f.items()} for f in feeds])
            return real(ex, feeds, **kw)

        monkeypatch.setattr(PlanExecutor, "run_passes", spy)


@pytest.fixture
def fed(monkeypatch: pytest.MonkeyPatch) -> Iterator[FedArrays]:
    yield FedArrays(monkeypatch)


def test_partition_records_the_description_beside_the_model(plans: dict[str, tuple[Plan, Path]],
                                                            models: dict[str, Path]) -> None:
    plan, folder = plans["described"]
    rec = plan.extra["pipeline"]
    assert rec["file"] == "pipeline/pipeline.json" and rec["pipeline"] == "FluxPipeline"
    assert (folder / rec["file"]).read_bytes() == (models["described"].parent / "pipeline.json").read_bytes()
    assert (folder / rec["values"]).read_bytes() == (models["described"].parent / "inputs.npz").read_bytes()
    d = plan_description(*load_plan(folder))
    assert d is not None and d.role_input("guidance") == "guidance" and d.cfg.mode == "distilled"
    assert plan_folder_problem(folder) is None  # --force may replace it: partition wrote every file in it
    bare, bare_folder = plans["bare"]
    assert "pipeline" not in bare.extra and not (bare_folder / "pipeline").exists()
    # the same stages either way: the description changes what the plan records, not how it is cut
    assert [s.sha256 for s in bare.stages] == [s.sha256 for s in plan.stages]


def test_a_description_that_does_not_match_the_model_is_refused_in_one_line(models: dict[str, Path],
                                                                              tmp_path: Path) -> None:
    doc = json.loads((models["described"].parent / "pipeline.json").read_text())
    bad = write(tmp_path / "bad", edited(doc, "inputs.guidance.dtype", "int64"), flux_ids())
    r = CliRunner().invoke(main, ["partition", str(models["bare"]), "--pipeline", str(bad), "--strategy", "fused",
                                  "--out", str(tmp_path / "plan"), "-q"])
    assert r.exit_code == 5, r.output
    assert r.stderr.strip().count("\n") == 0
    assert "does not match the model: input 'guidance' is int64 [1] in pipeline.json, float32 [1] in the model" \
        in r.stderr
    assert not (tmp_path / "plan").exists()  # nothing half-written
    ok = CliRunner().invoke(main, ["partition", str(models["bare"]), "--pipeline",
                                   str(models["described"].parent / "pipeline.json"), "--strategy", "fused",
                                   "--out", str(tmp_path / "plan"), "-q"])
    assert ok.exit_code == 0, ok.output
    assert "pipeline description: FluxPipeline" in ok.stdout
    assert load_plan(tmp_path / "plan")[0].extra["pipeline"]["values"] == "pipeline/inputs.npz"


def test_with_the_description_the_loop_feeds_timestep_guidance_and_ids_right(
        plans: dict[str, tuple[Plan, Path]], fed: FedArrays) -> None:
    plan, folder = plans["described"]
    traj = denoise(plan, folder, backend=None, steps=STEPS, cfg=True)  # --cfg: distilled has one pass anyway
    assert len(fed.calls) == STEPS and all(len(c) == 1 for c in fed.calls)
    sigmas = flow_sigmas(STEPS)
    ids = flux_ids()
    for i, (feed,) in enumerate(fed.calls):
        assert feed["guidance"].tolist() == [3.5]  # the pipeline's guidance_scale, not a timestep
        assert feed["timestep"].tolist() == [pytest.approx(sigmas[i])]  # FluxPipeline: t / 1000 = sigma
        assert np.array_equal(feed["img_ids"], ids["img_ids"]) and np.array_equal(feed["txt_ids"], ids["txt_ids"])
    # the conditioning is the same draw every step; the latent moves
    assert np.array_equal(fed.calls[0][0]["encoder_hidden_states"], fed.calls[-1][0]["encoder_hidden_states"])
    assert all(np.isfinite(x).all() and np.abs(x).max() < 100 for x in traj.latents)


def test_without_a_description_the_tie_is_refused_and_flags_cannot_make_up_ids(
        plans: dict[str, tuple[Plan, Path]]) -> None:
    plan, folder = plans["bare"]
    r = CliRunner().invoke(main, ["drift", str(folder), "--toolkit", "2.5.0", "-q"])
    assert r.exit_code == 5, r.output
    line = r.stderr.strip()
    assert "\n" not in line and line.startswith("rkpart: error: 2 inputs fit the timestep")
    assert "timestep, guidance" in line and "--timestep-input NAME [--guidance-input NAME]" in line
    for cmd in (["calibrate", str(folder), "-o", str(folder.parent / "calib")], ):
        r = CliRunner().invoke(main, [*cmd, "-q"])
        assert r.exit_code == 5 and "2 inputs fit the timestep" in r.stderr, r.output
    assert not (folder.parent / "calib").exists()
    from rkpart.bundle.loop import loop_record

    assert "2 inputs fit the timestep" in loop_record(plan, folder)["error"]
    # flags break the tie, but rkpart does not invent Flux's id grids: the plan needs its pipeline.json
    with pytest.raises(SpecError, match="input 'img_ids' is an id grid / RoPE table"):
        loop_inputs(plan, resolve_roles(plan, flags=RoleFlags(timestep="timestep", guidance="guidance")))


def test_embeds_give_the_loop_its_conditioning_and_a_nan_row_names_its_cause(
        plans: dict[str, tuple[Plan, Path]], fed: FedArrays, tmp_path: Path) -> None:
    plan, folder = plans["described"]
    rng = np.random.default_rng(5)
    prompt, pooled = rng.standard_normal((1, 6, 24)).astype(np.float32), rng.standard_normal((1, 16))
    np.savez(tmp_path / "embeds.npz", prompt_embeds=prompt, pooled_prompt_embeds=pooled)
    rows = drift([("fused", plan, folder)], OrtBackend(), steps=1, cfg=None, embeds=tmp_path / "embeds.npz")
    assert not nonfinite_rows(rows)
    assert all(np.array_equal(c[0]["encoder_hidden_states"], prompt) for c in fed.calls)
    assert all(np.array_equal(c[0]["pooled_projections"], pooled.astype(np.float32)) for c in fed.calls)
    # conditioning a float32 model cannot hold: the first stage output that overflows names what it read
    np.savez(tmp_path / "huge.npz", prompt_embeds=np.full((1, 6, 24), 3e38, np.float32), pooled_prompt_embeds=pooled)
    rows = drift([("fused", plan, folder)], OrtBackend(), steps=1, cfg=None, embeds=tmp_path / "huge.npz")
    bad = nonfinite_rows(rows)
    assert bad and all(r.cause == bad[0].cause for r in bad)
    cause = bad[0].cause or ""
    assert cause.startswith("ONNX Runtime reference, step 0, cond pass: stage prologue output ")
    assert "is the first with NaN/Inf" in cause
    assert "encoder_hidden_states (text_embeddings) float32 [3e+38, 3e+38]" in cause


def test_masks_are_fed_all_valid_never_noise(fed: FedArrays, tmp_path: Path) -> None:
    from tests.models.diffusers_families import cached_export

    plan = partition(cached_export("lumina2", "torchscript"), tmp_path / "lumina2", "fused")
    said: list[str] = []
    r = resolve_roles(plan, progress=said.append)
    assert r.roles["encoder_attention_mask"] == "attention_mask" and "guessed" in said[0]
    traj = denoise(plan, tmp_path / "lumina2", backend=None, steps=2, cfg=True)
    assert len(fed.calls) == 2 and all(len(c) == 2 for c in fed.calls)  # cond and uncond
    for call in fed.calls:
        for feed in call:
            mask = feed["encoder_attention_mask"]
            assert mask.dtype == np.int64 and (mask == 1).all()
    assert np.isfinite(traj.latents[-1]).all()
    # rkpart run's and profile's one pass too (rkpart.roles.pass_inputs)
    from rkpart.roles import pass_inputs

    assert (pass_inputs(plan, tmp_path / "lumina2", seed=3)["encoder_attention_mask"] == 1).all()


def test_a_batched_description_is_checked_against_the_model(plans: dict[str, tuple[Plan, Path]],
                                                             tmp_path: Path) -> None:
    """A description for the batch-2 export of the same pipeline is not this model's."""
    from tests.description.docs import flux_guidance_inputs

    ins = flux_guidance_inputs()
    for spec in ins.values():
        if spec["role"] in ("latent", "text_embeddings", "pooled_embeddings", "timestep"):
            spec["shape"] = [2, *spec["shape"][1:]]
    doc = base_doc(ins, batch=2)
    p = write(tmp_path, doc, flux_ids())
    plan, _ = plans["bare"]
    from rkpart.description import check_against, load_description

    with pytest.raises(SpecError, match=r"input 'hidden_states' is float32 \[2, 16, 16\] in pipeline.json, "
                                        r"float32 \[1, 16, 16\] in the model"):
        check_against(load_description(p), plan)
