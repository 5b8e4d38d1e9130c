"""``rkpart run PLAN --reference OUTPUTS.npz`` gates a plan against saved outputs without the whole model.

Two models ONNX Runtime refuses whole while every stage of their plans loads: PixArt's dynamo export
(the exporter's Squeeze of a dim of 16), gated against torch's own output; and, without torch, the
bundled example DiT with one dead node of an op no runtime here knows
(``com.example:Foo``, as an exporter leaves a custom op whose result nothing reads).  ONNX Runtime
refuses the whole graph at load (it wants a kernel for every node); rkpart drops the dead node when
it loads the model, so every stage of the plan loads.  The saved outputs are the model's own,
computed from the same graph without the dead node (what torch's would be, as a stand-in).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

from rkpart.cli import main
from rkpart.plan.plan import load_plan
from rkpart.runtime.executor import random_inputs, run_model

pytestmark = pytest.mark.slow  # a partition and a few plan runs (~5 s)


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> tuple[Path, Path, Path]:
    """(the model ORT refuses whole, its split plan, reference.npz holding the plan's inputs and outputs)."""
    root = tmp_path_factory.mktemp("refused")
    m = onnx.load(str(example_model))
    x = m.graph.input[0].name
    m.graph.node.append(helper.make_node("Foo", [x], ["dead_foo"], name="dead_custom_op", domain="com.example"))
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    model = root / "refused.onnx"
    onnx.save(m, str(model))
    folder = root / "plan"
    r = CliRunner().invoke(main, ["partition", str(model), "-s", "split", "-o", str(folder), "-q"])
    assert r.exit_code == 0, r.output
    plan, _ = load_plan(folder)
    feeds = random_inputs(plan.tensors, plan.inputs, seed=3)
    outs = run_model(example_model, feeds, plan.outputs)  # the same graph without the dead node
    ref = root / "reference.npz"
    np.savez(ref, **feeds, **outs)
    return model, folder, ref


def test_ort_refuses_the_whole_model_and_the_hint_says_so(refused: tuple[Path, Path, Path]) -> None:
    """Without --reference, run compares with the whole model: exit 5, naming ORT's refusal to load it
    (not the plan's inputs and outputs) and the way around it."""
    _, folder, _ = refused
    r = CliRunner().invoke(main, ["run", str(folder), "-q"])
    assert r.exit_code == 5, r.output
    msg = r.output.strip().splitlines()[-1]
    assert msg.startswith("rkpart: error: ONNX Runtime cannot load the whole model ") and "refused.onnx" in msg
    assert "--reference OUTPUTS.npz" in msg and "com.example:Foo" in msg
    assert "do the plan's inputs and outputs match" not in msg


def test_a_plan_is_gated_against_saved_outputs_without_the_whole_model(refused: tuple[Path, Path, Path],
                                                                      tmp_path: Path) -> None:
    """With --reference the plan runs on the file's inputs and is gated against its outputs; the whole
    model (which ORT refuses) is never loaded.  A wrong reference fails the gate (exit 8)."""
    _, folder, ref = refused
    cli = CliRunner()
    r = cli.invoke(main, ["run", str(folder), "--reference", str(ref), "--json", "-q"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["passed"] and rep["end_to_end"] == {} and rep["reference_model"] is None
    assert rep["reference_outputs"] == str(ref)
    plan, _ = load_plan(folder)
    assert set(rep["against_reference"]) == set(plan.outputs)
    assert all(m["cosine"] > 0.999999 for m in rep["against_reference"].values())
    # the gate is real: outputs these inputs do not give fail it
    held = dict(np.load(ref))
    bad = tmp_path / "wrong.npz"
    np.savez(bad, **{k: (-v if k in plan.outputs else v) for k, v in held.items()})
    r = cli.invoke(main, ["run", str(folder), "--reference", str(bad), "-q"])
    assert r.exit_code == 8 and "vs reference" in r.output, r.output


def test_a_reference_without_the_inputs_is_refused_in_one_line(refused: tuple[Path, Path, Path],
                                                               tmp_path: Path) -> None:
    _, folder, ref = refused
    plan, _ = load_plan(folder)
    held = dict(np.load(ref))
    outs_only = tmp_path / "outputs.npz"
    np.savez(outs_only, **{k: held[k] for k in plan.outputs})
    r = CliRunner().invoke(main, ["run", str(folder), "--reference", str(outs_only), "-q"])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert f"holds no input {plan.inputs[0]!r}" in r.output and "--inputs FILE.npz" in r.output
    # the inputs from their own file: the same gate passes
    ins = tmp_path / "inputs.npz"
    np.savez(ins, **{k: held[k] for k in plan.inputs})
    r = CliRunner().invoke(main, ["run", str(folder), "--inputs", str(ins), "--reference", str(outs_only), "-q"])
    assert r.exit_code == 0, r.output


@pytest.mark.export
def test_an_export_ort_refuses_whole_is_gated_against_torchs_outputs(tmp_path: Path) -> None:
    """PixArt's dynamo export: ONNX Runtime refuses the whole file (the exporter's Squeeze of a dim of 16,
    which torch's ``squeeze(d)`` leaves alone); rkpart loads that Squeeze as torch meant it and the plan's
    stages load.  Gated against torch's own output on the export's example inputs, saved in one .npz."""
    from tests.models.diffusers_families import cached_export, example_inputs, missing_dependencies, torch_outputs

    if missing_dependencies():
        pytest.skip(f"not installed: {missing_dependencies()}")
    model = cached_export("pixart", "dynamo")
    folder = tmp_path / "plan"
    cli = CliRunner()
    assert cli.invoke(main, ["partition", str(model), "-s", "split", "-o", str(folder), "-q"]).exit_code == 0
    r = cli.invoke(main, ["run", str(folder), "-q"])
    assert r.exit_code == 5 and "ONNX Runtime cannot load the whole model" in r.output and "Squeeze" in r.output
    feeds = example_inputs("pixart")
    ref = tmp_path / "torch.npz"
    np.savez(ref, **feeds, sample=torch_outputs("pixart", feeds))
    r = cli.invoke(main, ["run", str(folder), "--reference", str(ref), "--min-cosine", "0.99999", "--max-abs-rel",
                          "1e-4", "--json", "-q"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["passed"] and rep["reference_model"] is None and rep["against_reference"]["sample"]["cosine"] > 0.99999
