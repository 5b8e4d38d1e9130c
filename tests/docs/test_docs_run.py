"""Every shell and Python block of README.md and docs/*.md runs, against the bundled example.

Each page runs in a fresh folder holding the bundled example as ``model.onnx``; its blocks
run in page order in that folder, so a block may use what an earlier one wrote (``build/``,
profiles, ...).  Shell blocks run under ``bash -e -o pipefail`` with this checkout's
``rkpart`` and ``python`` first on ``PATH``; Python blocks run as scripts.  A block that
needs a board or a full-size model is preceded by ``<!-- docs-test: skip (reason) -->`` and
is not run (the reason is required).  Every fenced block must name its language:
``sh``/``bash``/``python`` are run, anything else (``text``, ``json``, ``yaml``, ...) is
not, so no command can hide in an unlabelled block.  A block preceded by
``<!-- docs-test: file NAME -->`` (e.g. an example spec) is written to ``NAME`` in the
page's folder before its blocks run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from rkpart.cli_args import bundled_example

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_LANGS = {"sh": "sh", "bash": "sh", "shell": "sh", "python": "python", "py": "python"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s*\((?P<reason>[^)]+)\)\s*-->\s*$")
FILE = re.compile(r"<!--\s*docs-test:\s*file\s+(?P<name>[\w.-]+)\s*-->\s*$")

pytestmark = [pytest.mark.slow, pytest.mark.toolkit]


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str  # as written
    body: str
    skip: str | None  # the reason, when marked
    file: str | None = None  # written to this file in the work folder before the page's blocks run

    @property
    def kind(self) -> str | None:
        return RUN_LANGS.get(self.lang)

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip().splitlines()
        mark = SKIP.search(before[-1].strip()) if before else None
        as_file = FILE.search(before[-1].strip()) if before else None
        indent = m.group("indent")
        body = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln for ln in m.group("body").splitlines())
        out.append(Block(page=page, line=text[: m.start()].count("\n") + 1, lang=m.group("lang"), body=body + "\n",
                         skip=mark.group("reason").strip() if mark else None,
                         file=as_file.group("name") if as_file else None))
    return out


def test_every_block_names_its_language() -> None:
    unlabelled = [b.where() for p in PAGES for b in blocks(p) if not b.lang]
    assert unlabelled == [], "label these blocks (sh, python, text, json, ...): " + ", ".join(unlabelled)


def test_skip_markers_are_on_runnable_blocks_only() -> None:
    odd = [b.where() for p in PAGES for b in blocks(p) if b.skip and b.kind is None]
    assert odd == []


@pytest.fixture(scope="module")
def toolkits() -> str:
    from tests.toolkits import get_toolkit, toolkits_dir

    for v in ("2.3.0", "2.3.2", "2.5.0"):
        get_toolkit(v)
    return str(toolkits_dir())


def _env(bin_dir: Path, toolkits: str, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RKPART_RUNNER_NPU_STANDIN",)}
    env["PATH"] = f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    env["RKPART_TOOLKITS_DIR"] = toolkits
    env["RKPART_CACHE_DIR"] = str(cache)
    env["MPLBACKEND"] = "Agg"
    return env


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_runs(page: Path, tmp_path: Path, toolkits: str) -> None:
    todo = [b for b in blocks(page) if b.kind is not None]
    if not any(b.skip is None for b in todo):
        pytest.skip(f"{page.name}: no runnable block" + (" (all marked skip)" if todo else ""))
    work = tmp_path / "work"
    work.mkdir()
    shutil.copyfile(bundled_example(), work / "model.onnx")  # README makes its MODEL.onnx with `rkpart example`
    # `python` and `rkpart` of this checkout's interpreter, whatever the shell's PATH says
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python", "python3"):  # a wrapper, not a symlink: a venv's python finds its venv by its own path
        (bin_dir / name).write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
        (bin_dir / name).chmod(0o755)
    rk = bin_dir / "rkpart"
    rk.write_text(f"#!/bin/sh\nexec {sys.executable} -c \"from rkpart.cli import main; main()\" \"$@\"\n")
    rk.chmod(0o755)
    env = _env(bin_dir, toolkits, tmp_path / "cache")
    for b in blocks(page):  # example files the commands use (`<!-- docs-test: file NAME -->`)
        if b.file is not None:
            (work / b.file).write_text(b.body)
    for b in todo:
        if b.skip is not None:
            continue
        if b.kind == "sh":
            cmd = ["bash", "-e", "-o", "pipefail", "-c", b.body]
        else:
            script = tmp_path / f"block_{b.line}.py"
            script.write_text(b.body)
            cmd = [sys.executable, str(script)]
        p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, (f"{b.where()} failed (exit {p.returncode}):\n{b.body}\n--- stdout\n"
                                   f"{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-3000:]}")
