"""A build that runs far past its peers is a hang: stopped, said at once, retried, reduced (issue 50).

The budget (:mod:`rkpart.compile.hang`) is checked on numbers here; the compile's handling runs
against the FAKE worker (``tests/compile/fake_worker.py``: ``fake_spin`` stands in for an optimiser
that never returns, spinning on the CPU until killed), with a budget of a few CPU seconds instead of
minutes.  The real hang (RFD4's ``replace_rms_norm`` on 2.5.0) is built in ``test_repartition.py``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from rkpart.compile.hang import HANG_FLOOR_S, Peer, PeerWatch, budget, hang_rules, predict
from rkpart.compile.runner import tree_usage
from rkpart.compile.toolkits import Toolkit

PEERS = [Peer("prologue", 5.0, 10, 1 << 10), Peer("b00.attn", 20.0, 60, 100 << 10), Peer("b00.ffn", 12.0, 12, 4 << 20)]


def test_peers_predict_by_size_above_the_fixed_cost() -> None:
    assert predict([], 60, 100 << 10) is None
    # a twin of b00.attn: its time (the FFN's variable part scaled by the node ratio 5: 5 + 7 x 5 = 40)
    assert predict(PEERS, 60, 100 << 10) == pytest.approx(40.0)
    # twice b00.attn's nodes: its variable part twice (5 + 15 x 2 = 35), the FFN's x 10 (75)
    assert predict(PEERS, 120, 100 << 10) == pytest.approx(75.0)
    # smaller than every peer: never scaled down
    assert predict(PEERS, 1, 1) == pytest.approx(20.0)
    assert predict([Peer("cached-before-cpu-was-recorded", 0.0, 10, 10)], 10, 10) is None


def test_the_budget_has_a_floor_and_says_where_it_comes_from() -> None:
    b = budget(PEERS, 60, 100 << 10, factor=5, floor=120)
    assert b is not None and b.cpu_s == pytest.approx(200.0)
    assert "5 x the 40.0 s of CPU that 3 finished build(s) predict" in b.why and "at least" not in b.why
    small = budget([Peer("a", 2.0, 10, 10), Peer("b", 3.0, 10, 10)], 10, 10, factor=5, floor=HANG_FLOOR_S)
    assert small is not None and small.cpu_s == HANG_FLOOR_S and f"at least {HANG_FLOOR_S:g} s" in small.why
    assert budget([], 10, 10) is None


def test_a_watch_tells_once_without_peers_and_stops_past_its_budget() -> None:
    said: list[str] = []
    w = PeerWatch(said.append, factor=3, floor=2)
    check = w.watch("2.5.0", "b01.attn", 60, 100 << 10, timeout=900)
    assert check is not None
    assert check(1.0, 1.0) is None and check(3.0, 4.0) is None and check(4.0, 5.0) is None  # no peer: runs on
    assert len(said) == 1 and said[0].startswith("[slow] b01.attn: still building after 3 s of CPU")
    assert "--timeout 900 s" in said[0]
    w.add("2.5.0", Peer("b00.attn", 1.5, 60, 100 << 10))  # a peer finished while it ran: the budget tightens
    w.add("2.3.0", Peer("b00.ffn", 0.1, 60, 100 << 10))  # another toolkit's build is no peer
    w.add("2.5.0", Peer("b01.attn", 0.1, 60, 100 << 10))  # nor is the stage itself
    assert check(4.4, 6.0) is None
    why = check(4.6, 6.0)
    assert why is not None and why.startswith("stopped as a hang after 5 s of CPU, past 4 s")
    assert said[-1].startswith("[hang] b01.attn: 5 s of CPU (6 s wall), past its budget of 4 s")
    assert [(h.stage, h.toolkit) for h in w.stops] == [("b01.attn", "2.5.0")]
    assert PeerWatch(said.append, factor=0).watch("2.5.0", "x", 1, 1, None) is None  # off: --timeout only


def test_the_rule_a_hung_build_is_rebuilt_without() -> None:
    log = ("D fuse_ops ...\nD fuse_ops results:\n"
           "D     convert_gemm_by_exmatmul: remove node = ['a'], add node = ['b']\n"
           "D     replace_rms_norm: remove node = ['norm_sq', 'norm', 'cond_weight'], add node = ['h_tp']\n")
    assert hang_rules(log) == ("replace_rms_norm",)  # the last rewrite before it stopped returning
    assert hang_rules(log, known=("fuse_exnorm_mul",)) == ("fuse_exnorm_mul",)  # a known issue's own rules
    assert hang_rules("D base_optimize ...\nD correct_ops ...\nD correct_ops done.\n") == ()  # no rewrite: none


def test_the_cpu_time_of_a_process_tree() -> None:
    rss, cpu = tree_usage(psutil.Process())
    assert rss > 0 and cpu > 0


# -- the compile (FAKE worker: no toolkit) ----------------------------------------------------------------


@pytest.mark.slow
def test_a_build_far_past_its_peers_is_stopped_said_and_rebuilt_with_its_rule_off(
        tmp_path: Path, fake_toolkit: Toolkit) -> None:
    """Two stages build in a fraction of a CPU second; the third spins after ``fake_rule`` rewrote its
    graph.  With a budget of 3x the peers' prediction, at least 1 s, it is stopped after about a second of
    CPU (its --timeout is 120 s), the user is told at once, and it is rebuilt with ``fake_rule`` off."""
    from rkpart.compile.compile import CompileOptions, compile_plan_report
    from tests.compile.conftest import FAKE_WORKER
    from tests.compile.plans import tiny_plan

    said: list[tuple[float, str]] = []
    config: dict[str, Any] = {"fake_burn": 0.1, "fake_spin": {"stage": "erf", "rule": "fake_rule"}}
    t0 = time.monotonic()
    rep = compile_plan_report(tiny_plan(tmp_path), tmp_path,
                              CompileOptions(fake_toolkit, "rk3588", config, worker=FAKE_WORKER, timeout=120,
                                             hang_factor=3, hang_floor=1.0, shared_cache=tmp_path / "cache"),
                              lambda m: said.append((time.monotonic(), m)))
    wall = time.monotonic() - t0
    assert [o.status for o in rep.outcomes] == ["built"] * 3, [o.failures for o in rep.outcomes]
    assert wall < 60, wall  # not the 120 s timeout
    lines = [m for _, m in said]
    hang = next(i for i, m in enumerate(lines) if m.startswith("[hang] erf:"))
    assert "stopped as a hang" in lines[hang] and "finished build(s) predict" in lines[hang]
    # told when it was stopped, before the retry (not in the summary at the end)
    retry = next(i for i, m in enumerate(lines) if m.startswith("[rules disabled] erf: fake_rule"))
    assert hang < retry and said[hang][0] - t0 < 45
    [h] = rep.hangs
    assert h.stage == "erf" and h.cpu_s > h.budget_s >= 1.0
    assert h.resolved_by == "rknn-toolkit2 fake, disable_rules=['fake_rule']"
    j = rep.to_json()
    assert j["hangs"][0]["stage"] == "erf" and j["hangs"][0]["resolved_by"].endswith("disable_rules=['fake_rule']")
    assert all(s["cpu_s"] > 0 for s in j["stages"])
    assert rep.plan.stage("erf").artifact() is not None


@pytest.mark.slow
def test_a_stage_that_hangs_with_every_workaround_is_reduced_by_a_default_compile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, example_model: Path) -> None:
    """The bundled example, ``split`` for 2.5.0: a FAKE 2.5.0 spins on any graph holding block 1's FFN
    ``Erf`` and names no rule.  The default compile stops that stage as a hang (block 0's FFN, its twin,
    built first), finds no rule to turn off, reduces the stage to the ``Erf`` (a candidate "hangs" past 3x
    the slowest build's CPU, at least the 1 s floor), moves it to the host, partitions the model again and
    builds: every stage built (the others from the cache), and the plan still computes the model (ONNX
    Runtime)."""
    from rkpart.cli import main
    from rkpart.compile.compile import CompileOptions
    from rkpart.plan.plan import load_plan
    from rkpart.repartition import compile_reducing_hangs
    from rkpart.runtime.executor import random_inputs, run_model, run_plan
    from rkpart.validation.metrics import compare
    from tests.compile.conftest import FAKE_WORKER

    monkeypatch.setenv("RKPART_CACHE_DIR", str(tmp_path / "cache"))  # its own learned-placement store
    folder = tmp_path / "plan"
    from click.testing import CliRunner

    r = CliRunner().invoke(main, ["partition", str(example_model), "-s", "split", "--toolkit", "2.5.0",
                                  "-o", str(folder), "-q"])
    assert r.exit_code == 0, r.output
    erf = "/transformer_blocks.1/ff/net.0/Erf"
    fake = Toolkit(version="2.5.0", python=Path(sys.executable), managed=False)
    opts = CompileOptions(fake, "rk3588", {"fake_spin": {"node": erf}}, worker=FAKE_WORKER,
                          timeout=120, hang_factor=3, hang_floor=1.0, shared_cache=tmp_path / "rknn-cache")
    said: list[str] = []
    t0 = time.monotonic()
    rep, rounds = compile_reducing_hangs(folder, opts, said.append)
    wall = time.monotonic() - t0
    assert rep.failed == () and rep.built, [o.failures for o in rep.outcomes]
    [rnd] = rounds
    assert rnd.moved == (erf,) and rnd.failed_before == 1 and rnd.failed_after == 0
    assert any(m.startswith("[hang] b01.ffn") for m in said)
    assert rep.cached and {o.stage_id for o in rep.built} <= {"b01.ffn", "b01.ffn.1"}  # only what changed
    assert any("reducing each to the ops that hang its build alone" in m for m in said)
    plan, _ = load_plan(folder)
    why = {h["op"]: h["why"] for h in plan.extra["capability"]["host_ops"]}
    assert "stopped as a hang" in why[erf] and "fails the build the same way alone" in why[erf]
    feeds = random_inputs(plan.tensors, plan.inputs, seed=0)
    ref = run_model(example_model, feeds, plan.outputs)
    out = run_plan(plan, folder, feeds)
    assert all(compare(out[n], ref[n]).cosine > 0.99999 for n in plan.outputs)
    assert wall < 120, wall
