"""A host stage that computes in bfloat16 runs on the board: the bundle carries it emulated.

ONNX Runtime's CPU provider has no bfloat16 ``MatMul``, ``Mul`` or ``Softmax`` (Sana-WM's camera
attention, left on the host where the toolkit cannot take it): the plan's own host stage file
does not even load in a plain ``onnxruntime.InferenceSession``, which is all the board runner
has.  The bundle writes such a stage with each bfloat16 op computed in float32 and rounded to
bfloat16, and the runner (NPU stages on its ONNX Runtime stand-in: no board here) passes its gate.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

from rkpart.bundle.build import bundle_plan
from rkpart.compile.compile import CompileOptions, compile_plan_report
from rkpart.pipeline import PartitionConfig, load, propose, write_plan
from tests.bundle.test_bundle import run_cli
from tests.targets.test_bfloat16_widen import attention
from tests.toolkits import get_toolkit

pytestmark = pytest.mark.toolkit


def test_a_bfloat16_host_stage_is_bundled_emulated_and_the_runner_passes(tmp_path: Path) -> None:
    model = tmp_path / "attn.onnx"
    onnx.save(attention(weights=True), str(model))
    m = load(model)
    # without the rewrites the bfloat16 island is the host's (as where a build puts it there)
    folder = tmp_path / "plan"
    plan = write_plan(m, propose(m, "generic", PartitionConfig(toolkit="2.5.0", rewrites=False)), folder)
    host = [s for s in plan.stages if s.device == "host"]
    assert len(host) == 1 and plan.npu_stages
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
        ort.InferenceSession(str(folder / host[0].file))
    rep = compile_plan_report(plan, folder, CompileOptions(get_toolkit("2.5.0"), "rk3588", {}, cache=False,
                                                           rewrites=False))
    assert not rep.failed
    out = tmp_path / "board"
    bundle_plan(folder, out)
    manifest = json.loads((out / "manifest.json").read_text())
    entry = next(e for e in manifest["stages"] if e["id"] == host[0].id)
    assert entry["bfloat16"] == "emulated"
    ort.InferenceSession(str(out / entry["file"]))  # the board's plain session takes it
    p = run_cli(out, "--inputs", "ref_inputs.npz", "--reference", "ref_outputs.npz", "--json", standin=folder)
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads(p.stdout)
    assert report["passed"]
    assert all(o["cosine"] > 0.999999 for o in report["outputs"].values())
