"""Rewrites weighed for memory, on real rknn-toolkit2 2.5.0 builds (issue 50, section 4).

The smallest model found that shows both sides (``bench/weigh_probe.py``): one block of the onnx-built Anima
(fp16) at 4 heads x 128 and 4096 image tokens (1024 px's token count).

* ``heads-table-layout`` changes only a layout.  In the ``fused`` block it costs 4 MiB of device memory
  (204.23 against 200.23 MiB, 0 CPU layers either way; the full-width 1024 px block: 45 MiB): compile
  weighs it and leaves it out.  (In the ``split`` self-attention of the same model it saves 4 MiB and is
  kept.)
* ``gelu-f16-sqrt2`` moves the GELU's ``Erf`` onto the NPU.  In the ``split`` FFN it costs 16 MiB of
  internal memory (68.0 against 52.0 MiB): a placement, never weighed, kept.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rkpart.compile.compile import CompileOptions, compile_plan_report
from rkpart.compile.weigh import WEIGHED_OUT, Verdict
from rkpart.pipeline import partition
from rkpart.plan.plan import load_plan
from tests.models.anima import AnimaConfig, build_anima_onnx
from tests.toolkits import get_toolkit

pytestmark = [pytest.mark.toolkit, pytest.mark.slow]

MIB = 1 << 20
#: bench/weigh_probe.py's smallest case where heads-table-layout loses (fused) and gelu-f16-sqrt2 costs memory
CONFIG = AnimaConfig(num_blocks=1, hidden=512, heads=4, ffn_dim=2048, context_dim=256, context_len=64,
                     latent_height=128, latent_width=128, adaln_lora_dim=32)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_anima_onnx(CONFIG, tmp_path_factory.mktemp("weigh") / "anima_4x128_4096.onnx")


def test_a_layout_rewrite_that_costs_memory_is_left_out(model: Path, tmp_path: Path) -> None:
    folder, cache = tmp_path / "fused", tmp_path / "cache"
    plan = partition(model, folder, "fused")
    said: list[str] = []
    opts = CompileOptions(get_toolkit("2.5.0"), shared_cache=cache, learn=False)
    rep = compile_plan_report(plan, folder, opts, progress=said.append)
    (o,) = rep.outcomes
    assert o.status == "built" and o.artifact is not None and o.artifact.compiler is not None
    assert o.cpu_ops == ()
    v = o.weighed
    assert v is not None and v.rewrites == ("heads-table-layout",) and not v.kept
    assert v.with_rewrites is not None and v.without is not None
    assert v.with_rewrites.cpu_layers == v.without.cpu_layers == 0
    with_mem, without_mem = v.with_rewrites.device_bytes, v.without.device_bytes
    assert with_mem is not None and without_mem is not None
    assert with_mem - without_mem >= 2 * MIB, (with_mem / MIB, without_mem / MIB)  # 4 MiB measured
    # the stage keeps the build without it: its memory is the smaller figure, plan.json says why
    assert o.artifact.compiler.device_mem_bytes == without_mem
    st = next(s for s in rep.plan.stages if s.id == o.stage_id)
    assert st.prepared is not None
    assert "heads-table-layout" not in st.prepared["rewrites"] and "gelu-f16-sqrt2" in st.prepared["rewrites"]
    assert st.prepared["dropped_rewrites"] == {"heads-table-layout": WEIGHED_OUT}
    assert Verdict.from_json(st.prepared["weighed"]) == v
    assert any(line.startswith("[weighing] b00.block") for line in said)
    assert any(line.startswith("[weighed] b00.block: heads-table-layout left out: ") for line in said)
    first = (folder / "plan.json").read_bytes()

    # a rerun builds nothing (the verdict and the build come from the cache) and writes the same plan.json
    said.clear()
    again = compile_plan_report(load_plan(folder)[0], folder, opts, progress=said.append)
    assert [x.status for x in again.outcomes] == ["cached"]
    assert (folder / "plan.json").read_bytes() == first
    assert any("from the build cache" in line for line in said)

    # --no-weigh-rewrites keeps it wherever it matches: the first build, from the cache (no build)
    kept = compile_plan_report(load_plan(folder)[0], folder,
                               CompileOptions(get_toolkit("2.5.0"), shared_cache=cache, learn=False,
                                              weigh_rewrites=False))
    (k,) = kept.outcomes
    assert k.status == "cached" and k.weighed is None and k.artifact is not None and k.artifact.compiler
    assert k.artifact.compiler.device_mem_bytes == with_mem
    assert kept.settings["weigh_rewrites"] is False


def test_a_rewrite_that_removes_a_cpu_layer_is_kept_though_it_costs_memory(model: Path, tmp_path: Path) -> None:
    folder = tmp_path / "split"
    plan = partition(model, folder, "split")
    tk = get_toolkit("2.5.0")
    rep = compile_plan_report(plan, folder, CompileOptions(tk, cache=False, learn=False, stages=["b00.ffn"]))
    (o,) = rep.outcomes
    assert o.artifact is not None and o.artifact.compiler is not None and o.cpu_ops == ()
    assert o.weighed is None  # a placement rewrite is not weighed
    st = next(s for s in rep.plan.stages if s.id == "b00.ffn")
    assert st.prepared is not None and "gelu-f16-sqrt2" in st.prepared["rewrites"]
    # without it: the Erf on the CPU, and less memory (16 MiB measured): the rewrite was kept at that price
    skip = compile_plan_report(load_plan(folder)[0], folder,
                               CompileOptions(tk, cache=False, learn=False, stages=["b00.ffn"],
                                              skip_rewrites=frozenset({"gelu-f16-sqrt2"})))
    (s,) = skip.outcomes
    assert s.artifact is not None and s.artifact.compiler is not None
    assert [c.split(":")[0] for c in s.cpu_ops] == ["Erf"]
    with_mem, without_mem = o.artifact.compiler.device_mem_bytes, s.artifact.compiler.device_mem_bytes
    assert with_mem is not None and without_mem is not None
    assert with_mem - without_mem >= 8 * MIB, (with_mem / MIB, without_mem / MIB)
