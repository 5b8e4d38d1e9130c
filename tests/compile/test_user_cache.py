"""The default-on user-level build cache, ``compile --stage`` and ``rkpart cache info|prune``.

Bookkeeping with the FAKE worker (instant "builds"); the re-partition round trip with real
rknn-toolkit2 builds of the bundled example is at the end (toolkit tier).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rkpart.cli import main
from rkpart.compile.compile import CompileOptions, CompileReport, compile_plan_report
from rkpart.compile.toolkits import Toolkit
from rkpart.compile.user_cache import entries, user_cache_dir
from rkpart.errors import UserError
from tests.compile.conftest import FAKE_WORKER
from tests.compile.plans import tiny_plan

# outside the fast tier: compiles through the fake-toolkit runner process (the fast tier stays under a minute of CPU)
pytestmark = pytest.mark.slow


def _compile(folder: Path, tk: Toolkit, **kw: Any) -> CompileReport:
    return compile_plan_report(tiny_plan(folder), folder, CompileOptions(tk, "rk3588", {}, worker=FAKE_WORKER, **kw))


def _statuses(rep: CompileReport) -> dict[str, str]:
    return {o.stage_id: o.status for o in rep.outcomes}


def test_cache_is_on_by_default_in_the_users_cache_dir(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    assert user_cache_dir() == Path(os.environ["RKPART_CACHE_DIR"]) / "rknn"
    rep = _compile(tmp_path / "a", fake_toolkit)
    assert set(_statuses(rep).values()) == {"built"}
    assert len([e for e in entries(user_cache_dir()) if not e.failure]) == 3
    # another plan folder with the same stages: nothing is built
    other = _compile(tmp_path / "b", fake_toolkit)
    assert set(_statuses(other).values()) == {"cached"}
    for s in other.plan.npu_stages:
        art = s.artifact()
        assert art is not None and (tmp_path / "b" / art.file).is_file()


def test_lost_rknn_folder_comes_back_from_the_cache_unless_no_cache(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    _compile(tmp_path, fake_toolkit)
    shutil.rmtree(tmp_path / "rknn")  # what `partition --force` does to a compiled folder
    again = _compile(tmp_path, fake_toolkit)
    assert set(_statuses(again).values()) == {"cached"}
    shutil.rmtree(tmp_path / "rknn")
    off = _compile(tmp_path, fake_toolkit, cache=False)
    assert set(_statuses(off).values()) == {"built"}


def test_no_cache_neither_reads_nor_fills_it(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    _compile(tmp_path, fake_toolkit, cache=False)
    assert entries(user_cache_dir()) == []


def test_compile_one_stage_keeps_the_others(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    first = _compile(tmp_path, fake_toolkit, stages=["erf"])
    assert _statuses(first) == {"erf": "built"}
    assert first.plan.stage("ffn").artifact() is None and first.plan.stage("erf").artifact() is not None
    second = compile_plan_report(first.plan, tmp_path, CompileOptions(fake_toolkit, "rk3588", {}, worker=FAKE_WORKER,
                                                                      stages=["ffn"]))
    assert _statuses(second) == {"ffn": "built"}
    assert second.plan.stage("erf").artifact() == first.plan.stage("erf").artifact()


@pytest.mark.parametrize("sid,message", [
    ("eft", "--stage 'eft' is not a stage of this plan; did you mean 'erf'?"),
    ("scale", "--stage 'scale' is a host stage"),
])
def test_bad_stage_ids_are_refused_before_building(tmp_path: Path, fake_toolkit: Toolkit, sid: str,
                                                   message: str) -> None:
    with pytest.raises(UserError) as e:
        _compile(tmp_path, fake_toolkit, stages=[sid])
    assert str(e.value).startswith(message)
    assert not (tmp_path / "rknn").exists()


def test_cli_stage_and_no_cache_conflict(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    tiny_plan(tmp_path).save(tmp_path)
    r = CliRunner().invoke(main, ["compile", str(tmp_path), "--toolkit", "2.3.0", "--stage", "nope"])
    assert r.exit_code != 0 and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["compile", str(tmp_path), "--toolkit", "2.3.0", "--no-cache", "--cache-dir",
                                  str(tmp_path / "c")])
    assert r.exit_code == 2 and "--no-cache and --cache-dir contradict each other" in r.output


def test_cache_info_and_prune(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    _compile(tmp_path / "a", fake_toolkit)
    root = user_cache_dir()
    es = entries(root)
    # make the use order known: ffn oldest, conv newest
    order = {e.key: e for e in es}
    t = 1_700_000_000
    for i, e in enumerate(sorted(es, key=lambda e: e.key)):
        os.utime(root / "objects" / f"{e.key}.json", (t + i * 100, t + i * 100))
    run = CliRunner().invoke
    info = json.loads(run(main, ["cache", "info", "--json"]).output)
    assert info["entries"] == 3 and info["toolkits"]["fake"]["entries"] == 3
    assert info["path"] == str(root) and info["bytes"] == sum(e.size_bytes for e in es)
    r = run(main, ["cache", "prune"])
    assert r.exit_code == 2 and "cache prune needs what to remove" in r.output
    r = run(main, ["cache", "prune", "--max-size", "lots"])
    assert r.exit_code == 2 and "expected a number" in r.output
    keep_bytes = sorted(es, key=lambda e: e.key)[-1].size_bytes
    r = run(main, ["cache", "prune", "--max-size", str(keep_bytes), "--dry-run"])
    assert r.exit_code == 0 and r.output.startswith("would remove 2 build(s)")
    assert len(entries(root)) == 3
    r = run(main, ["cache", "prune", "--max-size", str(keep_bytes)])
    assert r.exit_code == 0 and r.output.startswith("removed 2 build(s)")
    left = entries(root)
    assert [e.key for e in left] == [max(order)]  # the most recently used one
    assert not (root / "objects" / f"{min(order)}.rknn").exists()
    r = run(main, ["cache", "prune", "--toolkit", "fake"])
    assert r.exit_code == 0 and entries(root) == []


@pytest.mark.toolkit
@pytest.mark.slow
def test_partition_force_keeps_identical_builds(tmp_path: Path, example_model: Path) -> None:
    from tests.toolkits import get_toolkit

    get_toolkit("2.3.0")
    run = CliRunner().invoke
    plan = tmp_path / "plan"
    assert run(main, ["partition", str(example_model), "-o", str(plan), "-q"]).exit_code == 0
    first = run(main, ["compile", str(plan), "--toolkit", "2.3.0", "-q"])
    assert first.exit_code == 0 and "6 NPU stage(s): 6 built, 0 cached, 0 failed" in first.output
    r = run(main, ["partition", str(example_model), "-o", str(plan), "-q", "--force"])
    assert r.exit_code == 0 and not (plan / "rknn").exists()
    second = run(main, ["compile", str(plan), "--toolkit", "2.3.0", "-q"])
    assert second.exit_code == 0 and "6 NPU stage(s): 0 built, 6 cached, 0 failed" in second.output


def test_cache_prune_removes_weighed_rewrite_verdicts(tmp_path: Path, fake_toolkit: Toolkit) -> None:
    """Verdicts (``weigh/``) are counted by ``cache info`` and removed by ``--all`` / ``--older-than``, a verdict
    served from the cache counting as a use; ``--max-size`` and ``--toolkit`` leave them (they are bytes, and
    hold no toolkit); a file in ``weigh/`` that is not a verdict is never touched."""
    from rkpart.compile.weigh import Figures, VerdictStore, judge

    _compile(tmp_path / "a", fake_toolkit)
    root = user_cache_dir()
    store = VerdictStore([tmp_path / "plan-rknn", root])
    v = judge(["heads-table-layout"], Figures(0, 1 << 20, 4 << 20), Figures(0, 1 << 20, 3 << 20))
    old, used, new = "a" * 64, "b" * 64, "c" * 64
    for k in (old, used, new):
        store.put(k, v)
    junk = root / "weigh" / "notes.json"
    junk.write_text("{}")
    t = 1_700_000_000
    for k in (old, used):
        os.utime(root / "weigh" / f"{k}.json", (t, t))
    assert VerdictStore([tmp_path / "other-plan-rknn", root]).get(used) == v  # a use: its mtime is now
    run = CliRunner().invoke
    assert json.loads(run(main, ["cache", "info", "--json"]).output)["verdicts"] == 3
    r = run(main, ["cache", "prune", "--toolkit", "fake"])
    assert r.exit_code == 0 and "and 0 weighed-rewrite verdict(s)" in r.output
    r = run(main, ["cache", "prune", "--older-than", "30", "--dry-run"])
    assert r.exit_code == 0 and "would remove 0 build(s)" in r.output and "and 1 weighed-rewrite verdict(s)" in r.output
    assert (root / "weigh" / f"{old}.json").exists()
    r = run(main, ["cache", "prune", "--older-than", "30"])
    assert r.exit_code == 0 and "and 1 weighed-rewrite verdict(s)" in r.output
    assert sorted(p.name for p in (root / "weigh").iterdir()) == [f"{used}.json", f"{new}.json", "notes.json"]
    r = run(main, ["cache", "prune", "--all"])
    assert r.exit_code == 0 and "and 2 weighed-rewrite verdict(s)" in r.output
    assert [p.name for p in (root / "weigh").iterdir()] == ["notes.json"] and junk.read_text() == "{}"
    assert (tmp_path / "plan-rknn" / "weigh" / f"{old}.json").exists()  # a plan's own verdicts are its own
