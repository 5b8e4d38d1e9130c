"""Real rknn-toolkit2 builds of tiny stages (a few seconds each)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rkpart.compile.compile import CompileOptions, compile_plan_report
from rkpart.compile.toolkits import Toolkit
from rkpart.errors import UserError
from tests.compile.plans import _save, adaln_crash_plan, ffn_graph, only, tiny_plan

pytestmark = pytest.mark.toolkit


def test_230_builds_every_npu_stage_and_reports_placement(tmp_path: Path, tk230: Toolkit) -> None:
    lines: list[str] = []
    rep = compile_plan_report(tiny_plan(tmp_path), tmp_path, CompileOptions(tk230, "rk3588", {}, jobs=2),
                                                                            progress=lines.append)
    assert [o.status for o in rep.outcomes] == ["built"] * 3
    for o in rep.outcomes:
        a = o.artifact
        assert a is not None and a.toolkit == "2.3.0" and a.target == "rk3588"
        f = tmp_path / a.file
        assert f.stat().st_size == a.size_bytes > 0
        assert o.peak_rss_bytes > 50 * 2**20 and o.wall_s > 0
    cpu = {s.id: s.artifact().cpu_ops for s in rep.plan.npu_stages}  # type: ignore[union-attr]
    # standalone Erf falls back to the CPU; the Erf inside exact GELU fuses and stays on the NPU
    assert cpu == {"ffn": (), "erf": ("Erf:ef",), "conv": ()}
    on_disk = json.loads((tmp_path / "plan.json").read_text())
    assert on_disk["stages"][1]["artifacts"][0]["cpu_ops"] == ["Erf:ef"]
    assert any(ln.startswith("[1/3] building") and "memory in use" in ln for ln in lines)

    # a second run builds nothing; changing one stage rebuilds that one only
    again = compile_plan_report(rep.plan, tmp_path, CompileOptions(tk230, "rk3588", {}))
    assert [o.status for o in again.outcomes] == ["cached"] * 3
    sha = _save(ffn_graph(seed=11), tmp_path / "stages" / "ffn.onnx")
    # the plan must say so (an edited stage file alone is refused: issue 13)
    edited = rep.plan.replace_stage(dataclasses.replace(rep.plan.stage("ffn"), sha256=sha))
    third = compile_plan_report(edited, tmp_path, CompileOptions(tk230, "rk3588", {}))
    assert [o.status for o in third.outcomes] == ["built", "cached", "cached"]


def test_unknown_config_option_is_a_clear_failure(tmp_path: Path, tk230: Toolkit) -> None:
    """Refused once, before any build (issue 13), not as a failure of every stage."""
    plan = only(tiny_plan(tmp_path), "ffn")
    with pytest.raises(UserError, match=r"config option 'optimisation_level' is not accepted by RKNN\.config"):
        compile_plan_report(plan, tmp_path, CompileOptions(tk230, "rk3588", {"optimisation_level": 2}))
    assert not (tmp_path / "rknn" / "objects").exists()


def test_config_options_reach_the_toolkit(tmp_path: Path, tk230: Toolkit) -> None:
    plan = only(tiny_plan(tmp_path), "ffn")
    rep = compile_plan_report(plan, tmp_path, CompileOptions(tk230, "rk3588",
                                                             {"optimization_level": 1, "single_core_mode": True}))
    assert [o.status for o in rep.outcomes] == ["built"]
    log = (tmp_path / rep.outcomes[0].log).read_text()  # type: ignore[operator]
    # the native compiler echoes its mode: 7 (all three cores) by default, 1 in single-core mode
    assert "multi-core-model-mode = 1," in log


def test_real_build_timeout(tmp_path: Path, tk230: Toolkit, monkeypatch: pytest.MonkeyPatch) -> None:
    # each worker its own interpreter (no zygote): importing the toolkit alone takes ~2 s, so 0.5 s always times
    # out (forked from a warm zygote, this tiny stage builds in about 0.5 s)
    monkeypatch.setenv("RKPART_ZYGOTE", "0")
    rep = compile_plan_report(only(tiny_plan(tmp_path), "ffn", "erf"), tmp_path, CompileOptions(tk230, "rk3588", {},
                                                                                                timeout=0.5, jobs=2))
    for o in rep.outcomes:
        assert o.status == "failed"
        assert o.failures[0].kind == "timeout"
        assert o.failures[0].message.startswith("timed out after 0.5 s (build killed) in rknn-toolkit2 2.3.0")
    assert not list((tmp_path / "rknn").glob("**/*.part"))
    assert not (tmp_path / "rknn" / ".tmp").exists()


def test_232_segfault_is_isolated_and_250_falls_back(tmp_path: Path, tk232: Toolkit, tk250: Toolkit) -> None:
    rep = compile_plan_report(adaln_crash_plan(tmp_path), tmp_path, CompileOptions(tk232, "rk3588", {}, jobs=2,
                                                                                   fallback_toolkit=tk250))
    adaln, ffn = rep.plan.stage("adaln"), rep.plan.stage("ffn")
    first = adaln.failures[0]
    assert first.kind == "crash" and first.signal == "SIGSEGV" and first.exit_code == 139
    assert first.message.startswith("compiler crashed: SIGSEGV (exit 139) in rknn-toolkit2 2.3.2, last step ")
    art = adaln.artifact()
    assert art is not None and art.toolkit == "2.5.0" and art.fallback_reason == first.message
    assert ffn.artifact().toolkit == "2.3.2"  # type: ignore[union-attr]
    assert not rep.failed
