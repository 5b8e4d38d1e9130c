"""``pipeline.json``: loading, schema and semantic checks, and the check against a model's inputs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rkpart.description import check_against, load_description
from rkpart.errors import SpecError
from tests.description.docs import base_doc, edited, flux_guidance_inputs, flux_ids, write

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def doc() -> dict[str, Any]:
    return base_doc(flux_guidance_inputs())


def test_schema_in_docs_and_package_are_identical() -> None:
    assert (ROOT / "docs" / "pipeline.schema.json").read_bytes() == \
        (ROOT / "rkpart" / "data" / "pipeline.schema.json").read_bytes()


def test_loads_roles_values_and_sections(tmp_path: Path, doc: dict[str, Any]) -> None:
    p = write(tmp_path, doc, flux_ids())
    d = load_description(p)
    assert d.names == tuple(flux_guidance_inputs())
    assert d.role_input("latent") == "hidden_states" and d.role_input("timestep") == "timestep"
    assert d.role_input("guidance") == "guidance" and d.cfg.mode == "distilled" and d.cfg.guidance_scale == 3.5
    assert [i.name for i in d.with_role("image_ids", "text_ids")] == ["img_ids", "txt_ids"]
    assert d.input("encoder_hidden_states").argument == "prompt_embeds"
    ids = d.value_of("img_ids")
    assert ids is not None and np.array_equal(ids, flux_ids()["img_ids"]) and not ids.flags.writeable
    assert d.value_of("timestep") is None
    assert d.timestep.model_value(500.0) == pytest.approx(0.5)
    assert d.scheduler.config["shift"] == 3.0 and d.scheduler.mu == 0.5
    assert d.vae is not None and d.vae.scaling_factor == 0.3611
    assert len(d.sha256) == 64


def test_fields_added_within_version_1_are_accepted(tmp_path: Path, doc: dict[str, Any]) -> None:
    doc = edited(doc, "output.future_field", {"x": 1})
    doc["inputs"]["timestep"]["future"] = True
    assert load_description(write(tmp_path, doc, flux_ids())).output.name == "sample"


def test_features_name_what_a_description_uses_beyond_version_1(tmp_path: Path, doc: dict[str, Any]) -> None:
    """A plain version-1 description uses no feature; each added field is named by its value, so a reader can
    refuse one it does not implement (docs/pipeline-json.md, Features)."""
    from rkpart.description import FEATURES, features

    assert features(load_description(write(tmp_path, doc, flux_ids()))) == frozenset()
    doc = edited(edited(doc, "cfg", {"mode": "two-pass", "guidance_scale": 4.0, "guidance_input": None,
                                     "combine": "cond + g * (cond - uncond)", "renorm": "cond_l2_last_axis"}),
                 "inputs.guidance.role", "other")
    used = features(load_description(write(tmp_path, doc, flux_ids())))
    assert used == {"cfg.combine=cond + g * (cond - uncond)", "cfg.renorm=cond_l2_last_axis"} <= FEATURES.keys()
    with pytest.raises(SpecError, match=r"cfg\.renorm: 'l1' is not one of"):
        load_description(write(tmp_path, edited(doc, "cfg.renorm", "l1"), flux_ids()))



def test_every_feature_is_documented() -> None:
    """docs/pipeline-json.md's Features table names exactly rkpart.description.FEATURES (a runner follows it)."""
    import re

    from rkpart.description import FEATURES

    page = (ROOT / "docs" / "pipeline-json.md").read_text()
    table = page[page.index("## Features"):page.index("## Checks")]
    assert set(re.findall(r"^\| `([^`]+)` \|", table, re.M)) - {"feature"} == FEATURES.keys()


BAD = [
    (("version", 2), "is version 2; this rkpart reads version 1"),
    (("format", "other"), "not an rkpart pipeline description"),
    (("inputs.guidance.role", "guidence"), "inputs.guidance.role: 'guidence' is not one of"),
    (("inputs.guidance.shape", [0]), "inputs.guidance.shape[0]: 0 is less than the minimum of 1"),
    (("inputs.guidance.dtype", "float8"), "inputs.guidance.dtype: 'float8' is not one of"),
    (("cfg", ...), "'cfg' is a required property"),
    (("inputs.guidance.role", "timestep"), "2 inputs have role 'timestep' (timestep, guidance)"),
    (("cfg.guidance_input", "timestep"), "cfg.guidance_input 'timestep' is not an input with role 'guidance'"),
    (("inputs.hidden_states.role", "other"), "no input has role 'latent'"),
    (("values", "../inputs.npz"), "values: '../inputs.npz' does not match"),
    (("inputs.img_ids.value", "nope"), "input 'img_ids' takes value 'nope', which inputs.npz does not hold"),
    (("inputs.img_ids.shape", [8, 3]), "value 'img_ids' of input 'img_ids' is float32 [16, 3] in inputs.npz; "
                                       "the input is float32 [8, 3]"),
    (("inputs.timestep.value", "img_ids"), "changes every step; it cannot have a constant value"),
    (("timestep.scale", 1e300), "timestep.scale: 1e+300 is greater than the maximum"),
    (("inputs.timestep.negative_fill", 0), "input 'timestep' has negative_fill but no argument"),
    (("inputs.encoder_hidden_states.append_valid", 24), "appends 24 valid positions but its last axis holds only"),
    (("scheduler.set_timesteps.mu_rule", "flux2_empirical"), "mu_rule needs mu null and image_seq_len set"),
]


@pytest.mark.parametrize(("edit", "message"), BAD, ids=[e[0][0] + "=" + str(e[0][1])[:12] for e in BAD])
def test_bad_descriptions_are_one_line_spec_errors(tmp_path: Path, doc: dict[str, Any], edit: tuple[str, Any],
                                                   message: str) -> None:
    p = write(tmp_path, edited(doc, *edit), flux_ids())
    with pytest.raises(SpecError) as e:
        load_description(p)
    assert "\n" not in str(e.value)
    assert e.value.exit_code == 5
    assert message in str(e.value)


def test_not_json_too_large_fifo_and_nan(tmp_path: Path, doc: dict[str, Any]) -> None:
    p = tmp_path / "pipeline.json"
    p.write_text("{")
    with pytest.raises(SpecError, match="is not valid JSON"):
        load_description(p)
    p.write_bytes(b" " * (4 << 20) + b"{}")
    with pytest.raises(SpecError, match="too large"):
        load_description(p)
    p.unlink()
    os.mkfifo(p)
    with pytest.raises(SpecError, match="FIFO, not a regular file"):
        load_description(p)  # never opened: a FIFO would block
    p.unlink()
    p.write_text(json.dumps(doc).replace('"scale": 0.001', '"scale": NaN'))
    with pytest.raises(SpecError, match=r"timestep\.scale is nan, not a finite number"):
        load_description(p)
    with pytest.raises(SpecError, match="does not exist"):
        load_description(tmp_path / "missing.json")


def test_missing_values_file_and_nan_values(tmp_path: Path, doc: dict[str, Any]) -> None:
    p = write(tmp_path, doc)  # no inputs.npz
    with pytest.raises(SpecError, match=r"values 'inputs\.npz' is missing"):
        load_description(p)
    assert load_description(p, values=False).values == {}
    bad = flux_ids()
    bad["img_ids"][0, 0] = np.nan
    with pytest.raises(SpecError, match="value 'img_ids' of input 'img_ids' holds NaN/Inf"):
        load_description(write(tmp_path, doc, bad))


def test_check_against_model_inputs(tmp_path: Path, doc: dict[str, Any]) -> None:
    d = load_description(write(tmp_path, doc, flux_ids()))
    model = {n: (s["dtype"], tuple(s["shape"])) for n, s in flux_guidance_inputs().items()}
    check_against(d, model, outputs=["sample"])  # matches: no error
    for change, message in [
        ({"guidance": ("int64", (1,))}, "input 'guidance' is float32 [1] in pipeline.json, int64 [1] in the model"),
        ({"timestep": ("float32", (2,))}, "input 'timestep' is float32 [1] in pipeline.json, float32 [2] in the model"),
    ]:
        with pytest.raises(SpecError) as e:
            check_against(d, {**model, **change})
        assert message in str(e.value)
    less = {n: v for n, v in model.items() if n != "guidance"}
    with pytest.raises(SpecError, match="its input 'guidance' is not the model's"):
        check_against(d, less)
    with pytest.raises(SpecError, match="the model's input 'mask' is not in it"):
        check_against(d, {**model, "mask": ("int64", (1, 6))})
    with pytest.raises(SpecError, match="output 'sample' is not the model's"):
        check_against(d, model, outputs=["out"])
