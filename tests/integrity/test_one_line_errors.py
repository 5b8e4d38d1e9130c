"""Tracebacks and hangs of issue 13 become one-line errors with documented exit codes.

Every case is a real ``rkpart`` subprocess with a timeout: a hang fails the test, and the
stderr checked is exactly what a user sees.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.hostile.models import snapshot
from tests.integrity.test_confinement import one_line_error, rkpart

DEEP = "[" * 2000 + "]" * 2000
BIG_INT = "1" * 5000


def _mutated_plan(tmp: Path, plan: Path, fn: object) -> Path:
    out = tmp / "plan"
    shutil.copytree(plan, out)
    text = (out / "plan.json").read_text()
    (out / "plan.json").write_text(fn(text))  # type: ignore[operator]
    return out


@pytest.mark.parametrize("how", ["big-int", "deep", "deep-object"])
def test_plan_json_limits(tmp_path: Path, split_plan: Path, how: str) -> None:
    def big_int(t: str) -> str:
        d = json.loads(t)
        d["stages"][0]["weight_bytes"] = "@@"
        return json.dumps(d).replace('"@@"', BIG_INT)

    def deep(t: str) -> str:
        d = json.loads(t)
        d["extra"]["x"] = "@@"
        return json.dumps(d).replace('"@@"', DEEP)

    def deep_object(t: str) -> str:
        return '{"a":' * 2000 + "1" + "}" * 2000

    fn = {"big-int": big_int, "deep": deep, "deep-object": deep_object}[how]
    plan = _mutated_plan(tmp_path, split_plan, fn)
    msg = one_line_error(rkpart("run", plan, "-q"), 5, "plan")
    assert "digits" in msg or "nested" in msg


def test_huge_plan_json_is_refused_quickly(tmp_path: Path, split_plan: Path) -> None:
    """A 168 MB plan.json is refused by its size (sparse file: nothing is written to disk)."""
    plan = tmp_path / "plan"
    shutil.copytree(split_plan, plan)
    with open(plan / "plan.json", "r+b") as f:
        f.truncate(168 << 20)
    t0 = time.monotonic()
    one_line_error(rkpart("run", plan, "-q"), 5, "too large")
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("kind", ["yaml-int", "json-int", "yaml-deep", "json-deep"])
def test_spec_limits(tmp_path: Path, mini_model: Path, kind: str) -> None:
    spec = tmp_path / ("spec.json" if kind.startswith("json") else "spec.yaml")
    body = {"yaml-int": f"stages:\n  - id: a\n    blocks: [{BIG_INT}]\n",
            "json-int": f'{{"stages": [{{"id": "a", "blocks": [{BIG_INT}]}}]}}',
            "yaml-deep": "stages: " + DEEP + "\n",
            "json-deep": '{"stages": ' + DEEP + "}"}[kind]
    spec.write_text(body)
    out = tmp_path / "out"
    one_line_error(rkpart("partition", mini_model, "-o", out, "-s", "custom", "--spec", spec, "-q"), 5, "spec")
    assert not out.exists()


def test_fifo_as_spec_does_not_hang(tmp_path: Path, mini_model: Path) -> None:
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    r = rkpart("partition", mini_model, "-o", tmp_path / "out", "-s", "custom", "--spec", fifo, "-q", timeout=60)
    one_line_error(r, 5, "FIFO")


@pytest.mark.parametrize("kind", ["int", "deep"])
def test_cost_model_and_profile_limits(tmp_path: Path, mini_model: Path, kind: str) -> None:
    bad = BIG_INT if kind == "int" else DEEP
    cm = tmp_path / "cm.json"
    cm.write_text('{"components": ' + bad + "}")
    r = rkpart("partition", mini_model, "-o", tmp_path / "out", "-s", "auto", "--cost-model", cm, "-q")
    one_line_error(r, 5, "cost model")
    prof = tmp_path / "p.jsonl"
    prof.write_text('{"format": ' + bad + "}\n")
    one_line_error(rkpart("fit", prof, "-o", tmp_path / "m.json"), 5, "p.jsonl")


def test_fifo_as_cost_model_and_profile(tmp_path: Path, mini_model: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    r = rkpart("partition", mini_model, "-o", tmp_path / "out", "-s", "auto", "--cost-model", fifo, "-q",
               timeout=60)
    one_line_error(r, 5, "FIFO")
    one_line_error(rkpart("fit", fifo, "-o", tmp_path / "m.json", timeout=60), 5, "FIFO")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions; the tmpfs test covers EROFS")
def test_read_only_output_parent(tmp_path: Path, mini_model: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        one_line_error(rkpart("partition", mini_model, "-o", ro / "out", "-q"), 6, "cannot write")
    finally:
        ro.chmod(0o755)


def test_ctrl_c_exits_130(tmp_path: Path, bundled: Path) -> None:
    """SIGINT during a partition: exit 130, one line, and no output folder."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "rkpart.cli", "partition", str(bundled), "-o", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:  # wait until it is writing stages
        if (tmp_path / ".out.partial" / "stages").is_dir():
            break
        time.sleep(0.01)
    p.send_signal(signal.SIGINT)
    _out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "Aborted" not in err
    assert err.strip().splitlines()[-1] == "rkpart: interrupted"
    assert not out.exists()


def test_user_files_untouched_by_every_refusal(tmp_path: Path, split_plan: Path) -> None:
    """The refusals above write nothing into the plan folder."""
    plan = tmp_path / "plan"
    shutil.copytree(split_plan, plan)
    (plan / "plan.json").write_text('{"a": ' + BIG_INT + "}")
    before = snapshot(plan)
    one_line_error(rkpart("run", plan, "-q"), 5)
    assert snapshot(plan) == before
