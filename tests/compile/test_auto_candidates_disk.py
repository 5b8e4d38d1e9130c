"""``auto --toolkit V`` writes one plan per candidate family to build its representative blocks
(issue 26 part 4).  Without reflinks a plan's linked weights are a whole copy of the source's
data, so four families of the 3.9 GB full-size model took 16 GB of disk (measured: the 1024 px
full-size table ran out of space).  In auto's own temporary folder a family's copy is removed once
it is built; a ``compile_dir`` the user gives keeps whole plans."""

from __future__ import annotations

from pathlib import Path

import pytest

from rkpart.cost_model.features import stage_features
from rkpart.grounding import ground_candidates
from rkpart.pipeline import load, partition
from rkpart.plan.plan import load_plan
from tests.models.anima import AnimaConfig, build_anima_onnx

pytestmark = [pytest.mark.toolkit, pytest.mark.slow]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_anima_onnx(AnimaConfig.tiny(num_blocks=2), tmp_path_factory.mktemp("m") / "anima.onnx",
                            external_data=True)


def _built(folder: Path) -> list[str]:
    cand, _ = load_plan(folder)
    built = [s for s in cand.npu_stages if s.artifact("rknn") is not None]
    assert built and all(s.artifact("rknn").compiler is not None for s in built), folder
    assert all((folder / s.artifact("rknn").file).is_file() for s in built), folder
    return [s.id for s in built]


def test_auto_s_own_folder_drops_each_family_s_weights_once_built(model: Path, tmp_path: Path, tk250: object,
                                                                    toolkits_dir: Path) -> None:
    m = load(model)
    folders, notes = ground_candidates(m.graph, m.discovery(), "2.5.0", tmp_path / "w",
                                       toolkits_dir=str(toolkits_dir), keep_weights=False)
    assert len(folders) >= 3, notes  # split, split with AdaLN on the NPU, fused, fused x2
    for folder in folders:
        rec = load_plan(folder)[0].extra["weights"]
        assert rec["mode"] == "link" and rec["files"], folder
        assert not any((folder / "stages" / rel).exists() for rel in rec["files"]), folder
        _built(folder)
    assert model.with_name(model.name + ".data").stat().st_size > 0  # the source is untouched


def test_a_compile_dir_keeps_whole_plans_and_auto_chooses_from_the_compiler(model: Path, tmp_path: Path,
                                                                             tk250: object,
                                                                             toolkits_dir: Path) -> None:
    work = tmp_path / "candidates"
    plan = partition(model, tmp_path / "auto", "auto", toolkit="2.5.0", compile=True, compile_dir=str(work),
                     toolkits_dir=str(toolkits_dir))
    folders = sorted(p.parent for p in work.glob("*/plan.json"))
    assert len(folders) >= 3
    for folder in folders:
        cand, _ = load_plan(folder)
        for rel in cand.extra["weights"]["files"]:
            assert (folder / "stages" / rel).is_file(), (folder, rel)
        built = _built(folder)
        # still a plan: its stages read back whole (the bench reads features from them)
        assert all(stage_features(folder, s).compiled_mem_bytes for s in cand.npu_stages if s.id in built)
    assert plan.strategy["options"]["device_memory_source"] == ["compiler"]
