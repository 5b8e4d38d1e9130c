"""The rknn-sim gate of a compiled family plan, as the NPU family tests and ``scripts/npu_table.py --gate``
run it: the plan with every NPU stage in the toolkit's simulator against a reference.

The reference is, per export (:mod:`tests.partitioner.test_family_sweep`): ONNX Runtime's run of the
export on seeded random inputs; torch's own output on the family's example inputs where ONNX Runtime
refuses the export and torch is the reference (``TORCH_REFERENCE``); each NPU stage under ONNX Runtime
where the export is refused otherwise (``ORT_REFUSES``).  Exports whose shapes depend on data
(``SPECIALISE``) run on their example inputs, to which the plan was specialised.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rkpart.plan.plan import Plan
from rkpart.runtime.executor import random_inputs, run_model, run_plan
from rkpart.runtime.ort import OrtBackend
from rkpart.runtime.rknn_sim import RknnSimBackend
from rkpart.validation.metrics import compare

#: the gate's bar, per output (as ``rkpart compile --gate rknn-sim``'s tests hold it)
MIN_COSINE = 0.999


@dataclass(frozen=True)
class GateRow:
    """One compared tensor: where (``stage`` ``"plan"`` for the whole plan's output), and how close."""

    stage: str
    name: str
    cosine: float
    nan: int
    inf: int

    @property
    def ok(self) -> bool:
        return self.cosine >= MIN_COSINE and self.nan == 0 and self.inf == 0


def sim_gate(family: str, exporter: str, model: Path, plan: Plan, folder: Path,
             version: str) -> tuple[str, list[GateRow]]:
    """The reference kind (``"onnxruntime"``, ``"torch"`` or ``"stages"``) and one row per compared tensor."""
    from tests.models.diffusers_families import example_inputs, torch_outputs
    from tests.partitioner.test_family_sweep import ORT_REFUSES, SPECIALISE, TORCH_REFERENCE

    if (family, exporter) in TORCH_REFERENCE:
        feeds = example_inputs(family)
        out = run_plan(plan, folder, feeds, backend=RknnSimBackend(version))
        m = compare(out["sample"], torch_outputs(family, feeds))
        return "torch", [GateRow("plan", "sample", m.cosine, m.nan, m.inf)]
    if (family, exporter) in ORT_REFUSES:
        return "stages", each_npu_stage(plan, folder, version)
    if (family, exporter) in SPECIALISE:
        ex = example_inputs(family)
        feeds = {k: v for k, v in ex.items() if k in plan.inputs}
    else:
        feeds = random_inputs(plan.tensors, plan.inputs, seed=0)
    ref = run_model(model, feeds, plan.outputs)
    out = run_plan(plan, folder, feeds, backend=RknnSimBackend(version))
    rows = []
    for name in plan.outputs:
        m = compare(out[name], ref[name])
        rows.append(GateRow("plan", name, m.cosine, m.nan, m.inf))
    return "onnxruntime", rows


def each_npu_stage(plan: Plan, folder: Path, version: str) -> list[GateRow]:
    """Each NPU stage in the simulator against the same stage under ORT."""
    ort, sim = OrtBackend(), RknnSimBackend(version)
    rows = []
    try:
        for stage in plan.npu_stages:
            feeds = random_inputs(plan.tensors, stage.inputs, seed=0)
            outs = []
            for backend in (ort, sim):
                runner = backend.runner(stage, folder)
                runner.load()
                runner.init()
                outs.append(runner.infer(feeds))
                runner.release()
            for name in stage.outputs:
                m = compare(outs[1][name], outs[0][name])
                rows.append(GateRow(stage.id, name, m.cosine, m.nan, m.inf))
    finally:
        sim.close()
    return rows
