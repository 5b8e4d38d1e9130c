"""``auto --toolkit V`` writes one plan per candidate family to build its representative blocks
(issue 26 part 4).  Without reflinks a plan's linked weights are a whole copy of the source's
data, so four families of a 3.9 GB model took 16 GB of disk (measured: the 1024 px full-size
table ran out of space).  Once a family is built its copy is removed; its plan.json, stage graphs
and builds stay, and the choice made from them is the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rkpart.partitioner.plan import load_plan
from rkpart.pipeline import partition
from tests.models.anima import AnimaConfig, build_anima_onnx

pytestmark = [pytest.mark.toolkit, pytest.mark.slow]


def test_candidate_plans_keep_their_builds_not_a_copy_of_the_weights(tmp_path: Path, tk250: object,
                                                                      toolkits_dir: Path) -> None:
    model = build_anima_onnx(AnimaConfig.tiny(num_blocks=2), tmp_path / "m" / "anima.onnx", external_data=True)
    data = model.with_name(model.name + ".data")
    assert data.is_file()
    work = tmp_path / "candidates"
    plan = partition(model, tmp_path / "auto", "auto", toolkit="2.5.0", compile=True, compile_dir=str(work),
                     toolkits_dir=str(toolkits_dir))
    folders = sorted(p.parent for p in work.glob("*/plan.json"))
    assert len(folders) >= 3  # split, split with AdaLN on the NPU, fused, fused x2
    for folder in folders:
        cand, _ = load_plan(folder)
        rec = cand.extra["weights"]
        assert rec["mode"] == "link" and rec["files"], folder
        for rel in rec["files"]:
            assert not (folder / "stages" / rel).exists(), (folder, rel)
        built = [s for s in cand.npu_stages if s.artifact("rknn") is not None]
        assert built and all(s.artifact("rknn").compiler is not None for s in built), folder
        assert all((folder / s.artifact("rknn").file).is_file() for s in built), folder
    # the source model is untouched, and auto chose from the compiler's own tables
    assert data.is_file() and data.stat().st_size > 0
    opts = plan.strategy["options"]
    assert opts["device_memory_source"] == ["compiler"], json.dumps(opts)[:400]
