"""compile_plan's bookkeeping (cache, failures, plan rewriting) with the FAKE worker, which
"builds" instantly and crashes on request; real builds are in test_compile_real.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rkpart.compile.compile import CompileOptions, CompileReport, compile_plan, compile_plan_report
from rkpart.compile.toolkits import Toolkit
from rkpart.errors import OutputExistsError, SpecError
from rkpart.io import folder_lock
from tests.compile.conftest import FAKE_WORKER
from tests.compile.plans import tiny_plan

# outside the fast tier: compiles through the fake-toolkit runner process (the fast tier stays under a minute of CPU)
pytestmark = pytest.mark.slow


def _compile(folder: Path, tk: Toolkit, config: dict[str, Any] | None = None, **kw: Any) -> CompileReport:
    return compile_plan_report(tiny_plan(folder), folder, CompileOptions(tk, "rk3588", config or {},
                                                                         worker=FAKE_WORKER, **kw))


def test_crash_in_one_stage_does_not_stop_the_others(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    rep = _compile(tmp_path, fake_toolkit, config={"fake_crash_stage": "erf"}, jobs=2)
    status = {o.stage_id: o.status for o in rep.outcomes}
    assert status == {"ffn": "built", "erf": "failed", "conv": "built"}
    erf = rep.plan.stage("erf")
    assert erf.artifact() is None
    assert erf.failures[0].message.startswith("compiler crashed: SIGSEGV (exit 139) in rknn-toolkit2 fake")
    assert (tmp_path / erf.failures[0].log).is_file()
    assert rep.plan.stage("scale").artifacts == ()  # host stage untouched
    art = rep.plan.stage("ffn").artifact()
    assert art is not None and art.toolkit == "fake" and (tmp_path / art.file).is_file()


def test_rerun_builds_nothing_and_rewrites_the_same_plan(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    first = _compile(tmp_path, fake_toolkit)
    bytes1 = (tmp_path / "plan.json").read_bytes()
    second = compile_plan_report(first.plan, tmp_path, CompileOptions(fake_toolkit, "rk3588", {}, worker=FAKE_WORKER))
    assert [o.status for o in second.outcomes] == ["cached"] * 3
    assert (tmp_path / "plan.json").read_bytes() == bytes1


def test_changing_one_stage_rebuilds_only_that_stage(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    first = _compile(tmp_path, fake_toolkit)
    old = first.plan.stage("ffn").artifact()
    from tests.compile.plans import _save, ffn_graph

    _save(ffn_graph(seed=7), tmp_path / "stages" / "ffn.onnx")
    # an edited stage no longer matches plan.json: refused until the plan records it
    with pytest.raises(SpecError, match="sha256"):
        compile_plan_report(first.plan, tmp_path, CompileOptions(fake_toolkit, "rk3588", {}, worker=FAKE_WORKER))
    import dataclasses

    from rkpart.plan.extract import stage_sha256

    edited = dataclasses.replace(first.plan.stage("ffn"), sha256=stage_sha256(tmp_path / "stages" / "ffn.onnx"))
    second = compile_plan_report(first.plan.replace_stage(edited), tmp_path, CompileOptions(fake_toolkit, "rk3588", {},
                                                                                            worker=FAKE_WORKER))
    assert {o.stage_id: o.status for o in second.outcomes} == {"ffn": "built", "erf": "cached", "conv": "cached"}
    new = second.plan.stage("ffn").artifact()
    assert old is not None and new is not None and new.file != old.file


def test_changing_config_rebuilds_everything(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    first = _compile(tmp_path, fake_toolkit)
    second = compile_plan_report(first.plan, tmp_path, CompileOptions(fake_toolkit, "rk3588",
                                                                      {"optimization_level": 1}, worker=FAKE_WORKER))
    assert [o.status for o in second.outcomes] == ["built"] * 3
    assert second.plan.extra["compile"]["config"] == {"optimization_level": 1}


def test_crash_is_remembered_until_retry_failed(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    cfg = {"fake_crash_stage": "erf"}
    first = _compile(tmp_path, fake_toolkit, config=cfg)
    log = tmp_path / first.plan.stage("erf").failures[0].log
    log.write_text("stale")
    second = compile_plan_report(first.plan, tmp_path, CompileOptions(fake_toolkit, "rk3588", cfg, worker=FAKE_WORKER))
    assert second.failed[0].stage_id == "erf" and log.read_text() == "stale"  # not rebuilt
    assert second.plan.stage("erf").failures == first.plan.stage("erf").failures
    third = compile_plan_report(first.plan, tmp_path, CompileOptions(fake_toolkit, "rk3588", cfg, worker=FAKE_WORKER,
                                                                     retry_failed=True))
    assert third.failed[0].stage_id == "erf" and log.read_text() != "stale"  # rebuilt


def test_fallback_toolkit_builds_what_the_first_one_failed(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    # Two fakes: the first crashes on erf; the "fallback" is the same fake under another name,
    # and the crash option is keyed to a file name, so it crashes too: the stage stays failed
    # with both failures recorded, in order.
    fb = Toolkit(version="fake2", python=fake_toolkit.python, managed=False)
    rep = _compile(tmp_path, fake_toolkit, config={"fake_crash_stage": "erf"}, fallback_toolkit=fb)
    fails = rep.plan.stage("erf").failures
    assert [f.toolkit for f in fails] == ["fake", "fake2"]
    art = rep.plan.stage("ffn").artifact()
    assert art is not None and art.toolkit == "fake"


def test_compile_refuses_a_locked_folder(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    plan = tiny_plan(tmp_path)
    with folder_lock(tmp_path), pytest.raises(OutputExistsError):
        compile_plan(plan, tmp_path, fake_toolkit, worker=FAKE_WORKER)


def test_shared_cache_serves_another_plan_folder(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    shared = tmp_path / "shared"
    _compile(tmp_path / "p1", fake_toolkit, shared_cache=shared)
    rep = _compile(tmp_path / "p2", fake_toolkit, shared_cache=shared)
    assert [o.status for o in rep.outcomes] == ["cached"] * 3
    art = rep.plan.stage("conv").artifact()
    assert art is not None and (tmp_path / "p2" / art.file).is_file()


def test_failures_are_typed_and_plan_json_keeps_their_format(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    import json

    from rkpart.plan.plan import load_plan
    from rkpart.types import BuildFailure

    _compile(tmp_path, fake_toolkit, config={"fake_crash_stage": "erf"})
    raw = next(s for s in json.loads((tmp_path / "plan.json").read_text())["stages"] if s["id"] == "erf")
    assert list(raw["failures"][0]) == ["toolkit", "kind", "message", "exit_code", "signal", "last_step", "log"]
    assert raw["failures"][0]["kind"] == "crash" and raw["failures"][0]["signal"] == "SIGSEGV"
    plan, _ = load_plan(tmp_path)
    (fail,) = plan.stage("erf").failures
    assert isinstance(fail, BuildFailure) and fail.deterministic and fail.exit_code == 139
    # plans written before BuildFailure carried wall time and RSS in some entries: still readable
    old = BuildFailure.from_json({**raw["failures"][0], "wall_s": 1.5, "peak_rss_bytes": 10})
    assert old == fail and old.to_json() == raw["failures"][0]


def test_a_stage_is_rebuilt_without_the_rewrite_the_toolkit_crashes_on(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    """FAKE crash (fast tier; the real one, 2.5.0 on Lumina2, is in test_rewrite_retry.py): the worker
    segfaults on a graph holding nan-guard's nodes. The stage is built without nan-guard, with
    reciprocal-to-div kept; a rerun builds nothing (cached artifact and failures) and says the same."""
    import onnx
    from onnx import helper

    from rkpart.plan.plan import Plan, TensorInfo
    from tests.compile.plans import _stage
    from tests.compile.test_rewrites_npu import sdpa_bool_mask

    g = sdpa_bool_mask()
    g.output[0].name = "y0"
    g.node[-1].output[0] = "y0"
    g.node.append(helper.make_node("Reciprocal", ["y0"], ["y"], name="recip"))
    g.output.append(helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2, 8, 16]))
    del g.output[0]
    types = {1: "float32", 9: "bool"}
    tensors = {v.name: TensorInfo(v.name, types[v.type.tensor_type.elem_type],
                                  tuple(d.dim_value for d in v.type.tensor_type.shape.dim))
               for v in (*g.input, *g.output)}
    stage = _stage(tmp_path, "attn", "npu", g, 0)
    plan = Plan(model={"file": "m.onnx", "sha256": "0" * 64, "opset": 17}, strategy={"name": "test", "options": {}},
                inputs=tuple(i.name for i in g.input), outputs=("y",), tensors=tensors, stages=(stage,))
    plan.save(tmp_path)
    config = {"fake_crash_node": "IsNaN/count"}
    for run in range(2):
        said: list[str] = []
        rep = compile_plan_report(plan, tmp_path, CompileOptions(fake_toolkit, "rk3588", config, worker=FAKE_WORKER,
                                                                 cache=False), progress=said.append)
        (o,) = rep.outcomes
        assert o.status == ("built" if run == 0 else "cached") and o.failures == ()
        assert list(o.dropped_rewrites) == ["nan-guard"]
        assert o.dropped_rewrites["nan-guard"].startswith("the rknn-toolkit2 fake build with it failed: "
                                                         "compiler crashed: SIGSEGV")
        rec = rep.plan.stage("attn").prepared
        assert rec is not None and rec["rewrites"] == {"reciprocal-to-div": 1}
        assert rec["dropped_rewrites"] == dict(o.dropped_rewrites)
        built = [m for m in said if " building attn " in m]
        # with both, without both, then one dropped at a time in table order: reciprocal-to-div (crashes), nan-guard
        assert len(built) == (4 if run == 0 else 0)
        assert any(m.startswith("[rewrite dropped] attn: nan-guard: ") for m in said)
    plan = rep.plan


def test_skip_rewrite_leaves_one_rewrite_out_and_keeps_the_others(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    """``--skip-rewrite NAME``: the bundled self-attention is built without dedupe-constants (its four
    RoPE tables as exported) and still with heads-table-layout (2.5.0 only: the fake toolkit gets
    the rows of every toolkit); the build differs, and the other way round is cached apart."""
    from rkpart.cli_args import bundled_example
    from rkpart.pipeline import partition

    folder = tmp_path / "plan"
    partition(bundled_example(), folder, "split")

    def build(skip: frozenset[str]) -> tuple[dict[str, int], bytes]:
        from rkpart.plan.plan import load_plan

        plan, _ = load_plan(folder)
        rep = compile_plan_report(plan, folder, CompileOptions(fake_toolkit, "rk3588", {}, worker=FAKE_WORKER,
                                                               cache=False, stages=["b00.attn"], skip_rewrites=skip))
        (o,) = rep.outcomes
        assert o.status in ("built", "cached") and o.artifact is not None
        rec = rep.plan.stage("b00.attn").prepared
        assert rep.settings.get("skip_rewrites", []) == sorted(skip)
        return dict(rec["rewrites"]) if rec else {}, (folder / o.artifact.file).read_bytes()

    every, built_every = build(frozenset())
    assert every.get("dedupe-constants", 0) >= 2
    without, built_without = build(frozenset({"dedupe-constants"}))
    assert "dedupe-constants" not in without and {k: v for k, v in every.items() if k != "dedupe-constants"} == without
    assert built_without != built_every  # the fake build is the file it was given: the tables are back
    assert build(frozenset())[1] == built_every
