"""``auto`` excludes a candidate for a known toolkit crash only on the op pattern the crash was seen on.

A known-issue pattern's broad traits (AdaLN on the NPU, a LayerNorm that is no LayerNormalization
op) also fit an RMSNorm DiT, whose fused blocks build on rknn-toolkit2 2.3.0; only the signature
of the recorded reproducers (a decomposed LayerNorm times a modulation the stage computes, then a
linear layer: :mod:`rkpart.targets.known_issues`) excludes.  A broad match is *suspected*: the
candidate stays, and ``--toolkit`` builds it.

Models: the hand-built two-block DiT of ``tests/partitioner/test_discovery_traps.py`` (its norm
the only difference), and OmniGen from the diffusers sweep (a single-stream image DiT, TorchScript
export, RMSNorm: its ``fused`` plan builds on 2.3.0, 2/2 stages, 0 CPU layers, README's table).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rkpart.auto import AutoStrategy, select
from rkpart.cost_model.model import load_model_or_default
from rkpart.cost_model.select import Selection, SelectionConfig
from rkpart.discovery.structure import discover
from rkpart.ir import load_model
from rkpart.pipeline import PartitionConfig, load, propose
from tests.partitioner.test_discovery_traps import build_dit


def _fused(sel: Selection) -> list:  # type: ignore[type-arg]
    return [o for lst in sel.options.values() for o in lst if o.candidate.family in ("fused", "fused-x2")]


@pytest.mark.parametrize(("norm", "known"), [("decomposed", True), ("rms", False)])
def test_only_the_reproducers_op_pattern_excludes(tmp_path: Path, norm: str, known: bool) -> None:
    mg = load_model(build_dit(tmp_path / "m.onnx", norm=norm))
    sel = select(mg, discover(mg), load_model_or_default(None), SelectionConfig(toolkit="2.3.0"))
    fused = _fused(sel)
    assert fused
    for o in fused:
        assert o.candidate.adaln_on_npu and o.candidate.layernorm == "decomposed"  # the broad form fits both
        if known:  # decomposed LayerNorm times the stage's own SiLU + MatMul modulation: the reproducer's pattern
            assert o.excluded and o.excluded.startswith("known issue exnorm-fusion-segv: rknn-toolkit2 2.3.0")
            assert "decomposed (opset 13) LayerNorm times a per-sample modulation" in o.excluded
        else:
            assert o.excluded is None
            assert "suspected exnorm-fusion-segv" in sel.reason(o)
            assert "`--toolkit 2.3.0` builds it to decide" in sel.reason(o)
            assert "suspected" in o.to_json()
    if not known:
        assert any(o.candidate.family.startswith("fused") for o in sel.chosen)  # fewer stages: chosen


def _omnigen() -> Path:
    from tests.models.diffusers_families import cached_export

    return cached_export("omnigen", "torchscript")


@pytest.mark.export
@pytest.mark.slow
def test_auto_without_a_toolkit_keeps_an_rmsnorm_dits_fused_blocks() -> None:
    m = load(_omnigen())
    seen: list[Selection] = []
    part = propose(m, AutoStrategy(report=seen.append), PartitionConfig()).partition
    sel = seen[-1]
    assert sel.toolkit == "2.3.0"  # the default: the shipped calibration's
    assert not [o.key for lst in sel.options.values() for o in lst if o.excluded]
    assert all("suspected exnorm-fusion-segv" in sel.reason(o) for o in _fused(sel))
    assert [o.candidate.id for o in sel.chosen] == ["fused-x2"]  # 1 NPU stage for its 2 blocks, not split's 4
    assert sum(g.device == "npu" for g in part.groups) == 1


@pytest.mark.export
@pytest.mark.toolkit
@pytest.mark.slow
def test_auto_with_toolkit_230_builds_the_suspects_and_chooses_from_the_compiler(tmp_path: Path) -> None:
    from rkpart.plan.plan import load_plan
    from tests.toolkits import get_toolkit, toolkits_dir

    get_toolkit("2.3.0")
    m = load(_omnigen())
    seen: list[Selection] = []
    opts = {"toolkit": "2.3.0", "compile": True, "toolkits_dir": str(toolkits_dir()),
            "compile_dir": str(tmp_path / "candidates")}
    propose(m, AutoStrategy(report=seen.append), PartitionConfig(toolkit="2.3.0", options=opts))
    sel = seen[-1]
    # every family's representative built, with no op left on the CPU: nothing is excluded
    for fam in ("split", "split-adaln-npu", "fused", "fused-x2"):
        plan, _ = load_plan(tmp_path / "candidates" / fam)
        arts = [s.artifact("rknn") for s in plan.npu_stages if s.artifact("rknn") is not None]
        assert arts and all(a is not None and not a.cpu_ops for a in arts), fam
    assert not [o.key for lst in sel.options.values() for o in lst if o.excluded]
    for o in _fused(sel):
        assert "suspected exnorm-fusion-segv" in sel.reason(o) and "built by rknn-toolkit2 2.3.0" in sel.reason(o)
    # the choice reads the compiler's own memory tables, not the prediction
    assert [o.candidate.id for o in sel.chosen] == ["fused-x2"]
    assert all(o.device_source == "compiler" for o in sel.chosen)
