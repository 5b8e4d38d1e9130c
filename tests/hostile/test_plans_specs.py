"""Plans and custom specs are validated against their documented schemas (issue 8 item 3).

Custom specs go through ``rkpart partition -s custom --spec``; plans through ``rkpart run``
(which loads them with ``load_plan``).  Every case: exit 5 (SpecError), one line naming the
problem, nothing written.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jsonschema
import pytest

from rkpart.grouping.strategies.custom import SPEC_SCHEMA, spec_schema_json
from rkpart.plan.plan import load_plan
from rkpart.plan.schema import PLAN_SCHEMA, schema_json
from tests.hostile.models import assert_user_error, cli, siblings, snapshot

SPEC = 5
DOCS = Path(__file__).resolve().parents[2] / "docs"


# -- documented schemas match the code ---------------------------------------------------------


def test_plan_schema_doc_is_generated_from_code() -> None:
    assert (DOCS / "plan.schema.json").read_text() == schema_json(), (
        "docs/plan.schema.json is stale: run python -m rkpart.plan.schema_docs docs"
    )


def test_custom_spec_schema_doc_is_generated_from_code() -> None:
    assert (DOCS / "custom-spec.schema.json").read_text() == spec_schema_json(), (
        "docs/custom-spec.schema.json is stale: run python -m rkpart.plan.schema_docs docs"
    )


def _properties(schema: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in schema.get("properties", {}).items():
        out.add(k)
        if isinstance(v, dict):
            out |= _properties(v, prefix + k + ".")
            items = v.get("items")
            if isinstance(items, dict):
                out |= _properties(items, prefix + k + "[].")
            add = v.get("additionalProperties")
            if isinstance(add, dict):
                out |= _properties(add, prefix + k + "{}.")
    return out


@pytest.mark.parametrize(("doc", "schema"), [("plan.md", PLAN_SCHEMA), ("custom-spec.md", SPEC_SCHEMA)])
def test_every_schema_field_is_documented(doc: str, schema: dict) -> None:
    text = (DOCS / doc).read_text()
    missing = sorted(f for f in _properties(schema) if f"`{f}`" not in text)
    assert not missing, f"docs/{doc} does not describe {missing}"


def test_schemas_are_valid_json_schemas() -> None:
    jsonschema.Draft202012Validator.check_schema(PLAN_SCHEMA)
    jsonschema.Draft202012Validator.check_schema(SPEC_SCHEMA)


# -- custom specs ------------------------------------------------------------------------------


def _spec_fails(tmp_path: Path, model: Path, text: str, *needles: str, name: str = "spec.yaml") -> str:
    spec = tmp_path / name
    spec.write_text(text)
    out = tmp_path / "out"
    r = cli(["partition", model, "-o", out, "-s", "custom", "--spec", spec, "-q"])
    msg = assert_user_error(r, SPEC, *needles)
    assert not out.exists() and siblings(out) == []
    return msg


def test_valid_spec_works(tmp_path: Path, mini_model: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("version: 1\nstages:\n  - id: whole\n    blocks: [0]\n")
    r = cli(["partition", mini_model, "-o", tmp_path / "out", "-s", "custom", "--spec", spec, "-q"])
    assert r.exit_code == 0, r.output
    plan, _ = load_plan(tmp_path / "out")
    assert "whole" in [s.id for s in plan.stages]


def test_invalid_yaml(tmp_path: Path, mini_model: Path) -> None:
    _spec_fails(tmp_path, mini_model, "version: 1\nstages: [ {id: a\n", "spec.yaml", "not valid YAML", "line")


def test_invalid_json(tmp_path: Path, mini_model: Path) -> None:
    _spec_fails(tmp_path, mini_model, '{"version": 1, "stages": [', "spec.json", "not valid JSON", name="spec.json")


@pytest.mark.slow  # runs partition in a fresh CLI process (1.3 s)
def test_deeply_nested_yaml(tmp_path: Path, mini_model: Path) -> None:
    _spec_fails(tmp_path, mini_model, "[" * 50000 + "]" * 50000, "not valid YAML")


@pytest.mark.slow  # runs partition in a fresh CLI process (1.3 s)
def test_yaml_alias_bomb(tmp_path: Path, mini_model: Path) -> None:
    """Nine levels of 9x aliases: 387 million strings if walked; refused by counting."""
    lines = ["version: 1", "a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines.append("stages: [{id: s, block: 0, regions: *a9}]")
    _spec_fails(tmp_path, mini_model, "\n".join(lines) + "\n", "more than")


def test_empty_spec(tmp_path: Path, mini_model: Path) -> None:
    _spec_fails(tmp_path, mini_model, "", "(top level)")


def test_spec_not_a_mapping(tmp_path: Path, mini_model: Path) -> None:
    _spec_fails(tmp_path, mini_model, "- just\n- a list\n", "(top level)", "not of type 'object'")


def test_missing_spec_file(tmp_path: Path, mini_model: Path) -> None:
    out = tmp_path / "out"
    r = cli(["partition", mini_model, "-o", out, "-s", "custom", "--spec", tmp_path / "nope.yaml", "-q"])
    assert_user_error(r, SPEC, "nope.yaml", "does not exist")
    assert not out.exists()


@pytest.mark.parametrize(("body", "needles"), [
    ("version: 2\nstages: [{id: a, blocks: [0]}]", ("at version",)),
    ("version: 1\nstages: [{id: a, blocks: '0'}]", ("at stages/0/blocks", "not of type 'array'")),
    ("version: 1\nstages: [{id: a, blocks: [zero]}]", ("at stages/0/blocks/0", "not of type 'integer'")),
    ("version: 1\nstages: [{id: a, blocks: [-1]}]", ("at stages/0/blocks/0",)),
    ("version: 1\nstages: [{id: a, blocks: [0], colour: red}]", ("at stages/0", "colour")),
    ("version: 1\nstages: [{id: a, blocks: [0]}]\nextra: 1", ("(top level)", "extra")),
    ("version: 1\nstages: [{id: '../../etc', blocks: [0]}]", ("at stages/0/id",)),
    ("version: 1\nstages: [{id: a, blocks: [0], block: 0, regions: [attn]}]", ("exactly one of",)),
    ("version: 1\nstages: [{id: a}]", ("exactly one of",)),
    ("version: 1\nstages: []", ("at stages",)),
    ("version: 1\nstages: [{id: a, device: gpu, blocks: [0]}]", ("at stages/0/device",)),
    ("version: 1\nrest: magic\nstages: [{id: a, blocks: [0]}]", ("at rest",)),
    ("version: 1\nstages: [{id: a, blocks: [0]}, {id: a, block: 0, regions: [ffn]}]", ("'a'", "used twice")),
])
def test_spec_schema_violations(tmp_path: Path, mini_model: Path, body: str, needles: tuple[str, ...]) -> None:
    _spec_fails(tmp_path, mini_model, body + "\n", *needles)


def test_unknown_block_index(tmp_path: Path, mini_model: Path) -> None:
    _spec_fails(tmp_path, mini_model, "version: 1\nstages: [{id: a, blocks: [7]}]\n", "block 7 does not exist")


def test_unknown_block_for_regions(tmp_path: Path, mini_model: Path) -> None:
    _spec_fails(tmp_path, mini_model, "version: 1\nstages: [{id: a, block: 3, regions: [attn]}]\n",
                "block 3 does not exist")


def test_unknown_region(tmp_path: Path, mini_model: Path) -> None:
    _spec_fails(tmp_path, mini_model, "version: 1\nstages: [{id: a, block: 0, regions: [moe]}]\n",
                "no region 'moe'")


def test_cut_tensor_not_in_model(tmp_path: Path, mini_model: Path) -> None:
    _spec_fails(tmp_path, mini_model,
                "version: 1\nstages: [{id: a, cut: {inputs: [nope], outputs: [sample]}}]\n", "'nope'")


def test_stage_id_collides_with_rest(tmp_path: Path, mini_model: Path) -> None:
    _spec_fails(tmp_path, mini_model, "version: 1\nstages: [{id: b00.ffn, block: 0, regions: [attn]}]\n",
                "b00.ffn", "collides")


def test_bad_rest_options(tmp_path: Path, mini_model: Path) -> None:
    _spec_fails(tmp_path, mini_model,
                "version: 1\nrest_options: {adaln: bogus}\nstages: [{id: a, block: 0, regions: [ffn]}]\n",
                "rest_options", "adaln")


def test_grouping_with_a_cycle(tmp_path: Path, mini_model: Path) -> None:
    """attn and ffn of a block in one stage, xattn (between them) in another: a cycle."""
    _spec_fails(tmp_path, mini_model,
                "version: 1\nstages: [{id: af, block: 0, regions: [attn, ffn]}]\n", "cycle")


# -- plans -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def good_plan(fused_mini_plan: Path) -> Path:
    return fused_mini_plan


def _plan_copy(good_plan: Path, tmp_path: Path) -> tuple[Path, dict]:
    dst = tmp_path / "plan"
    shutil.copytree(good_plan, dst)
    return dst, json.loads((dst / "plan.json").read_text())


def _run_fails(folder: Path, *needles: str, code: int = SPEC) -> str:
    before = snapshot(folder)
    r = cli(["run", folder, "-q"])
    msg = assert_user_error(r, code, *needles)
    assert snapshot(folder) == before
    return msg


def _write(folder: Path, data: dict) -> None:
    (folder / "plan.json").write_text(json.dumps(data))


def test_good_plan_runs(good_plan: Path) -> None:
    r = cli(["run", good_plan, "-q"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("path", ["../outside.onnx", "stages/../../outside.onnx", "/etc/passwd"])
def test_stage_file_leaving_the_folder(good_plan: Path, tmp_path: Path, path: str) -> None:
    folder, data = _plan_copy(good_plan, tmp_path)
    data["stages"][0]["file"] = path
    _write(folder, data)
    _run_fails(folder, repr(path), "leaves the plan folder")


def test_stage_file_symlink_leaving_the_folder(good_plan: Path, tmp_path: Path) -> None:
    folder, data = _plan_copy(good_plan, tmp_path)
    outside = tmp_path / "outside.onnx"
    stage_file = folder / data["stages"][0]["file"]
    shutil.copy(stage_file, outside)
    stage_file.unlink()
    os.symlink(outside, stage_file)
    _run_fails(folder, data["stages"][0]["file"], "leaves the plan folder")


def test_artifact_file_leaving_the_folder(good_plan: Path, tmp_path: Path) -> None:
    folder, data = _plan_copy(good_plan, tmp_path)
    data["stages"][1]["artifacts"] = [{"kind": "rknn", "file": "../../x.rknn", "toolkit": "2.3.0",
                                       "target": "rk3588", "config_hash": "0", "sha256": "0", "size_bytes": 1}]
    _write(folder, data)
    _run_fails(folder, "'../../x.rknn'", "leaves the plan folder")


def test_load_plan_check_inside_directly(good_plan: Path, tmp_path: Path) -> None:
    """The library entry point refuses the same plans (compile, profile, run all use it)."""
    from rkpart.errors import SpecError

    folder, data = _plan_copy(good_plan, tmp_path)
    data["stages"][0]["file"] = "../evil.onnx"
    _write(folder, data)
    with pytest.raises(SpecError, match="leaves the plan folder"):
        load_plan(folder)


def test_plan_not_json(good_plan: Path, tmp_path: Path) -> None:
    folder, _ = _plan_copy(good_plan, tmp_path)
    (folder / "plan.json").write_text("{ not json")
    _run_fails(folder, "plan.json", "is not valid JSON")


def test_plan_binary_garbage(good_plan: Path, tmp_path: Path) -> None:
    folder, _ = _plan_copy(good_plan, tmp_path)
    (folder / "plan.json").write_bytes(bytes(range(256)) * 4)
    _run_fails(folder, "plan.json")


def test_no_plan(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    _run_fails(tmp_path / "empty", "no plan")


@pytest.mark.parametrize(("edit", "needles"), [
    (lambda d: d.update(version=2), ("at version",)),
    (lambda d: d.update(format="onnx"), ("at format",)),
    (lambda d: d.pop("stages"), ("(top level)", "'stages'")),
    (lambda d: d["stages"][0].update(weight_bytes="big"), ("at stages/0/weight_bytes", "not of type 'integer'")),
    (lambda d: d["stages"][0].update(device="gpu"), ("at stages/0/device",)),
    (lambda d: d["stages"][0].update(outputs=[]), ("at stages/0/outputs",)),
    (lambda d: d["stages"][0].update(sha256="abc"), ("at stages/0/sha256",)),
    (lambda d: d["stages"][0].update(block=-1), ("at stages/0/block",)),
    (lambda d: d["stages"][1].update(id=d["stages"][0]["id"]), ("used twice",)),
    (lambda d: d["stages"].reverse(), ("before any stage produces it",)),
    (lambda d: d["stages"][0]["inputs"].append("ghost"), ("'ghost'", "missing from 'tensors'")),
    (lambda d: d.update(outputs=["ghost"]), ("'ghost'",)),
    (lambda d: next(iter(d["tensors"].values())).update(dtype="quaternion"), ("unknown dtype 'quaternion'",)),
    (lambda d: next(iter(d["tensors"].values())).update(shape=[-1, 4]), ("shape",)),
    (lambda d: d["model"].update(sha256=7), ("at model/sha256",)),
])
def test_plan_schema_violations(good_plan: Path, tmp_path: Path, edit, needles: tuple[str, ...]) -> None:
    folder, data = _plan_copy(good_plan, tmp_path)
    edit(data)
    _write(folder, data)
    _run_fails(folder, *needles)


def test_plan_not_an_object(good_plan: Path, tmp_path: Path) -> None:
    folder, _ = _plan_copy(good_plan, tmp_path)
    (folder / "plan.json").write_text("[1, 2, 3]")
    _run_fails(folder, "not a JSON object")
