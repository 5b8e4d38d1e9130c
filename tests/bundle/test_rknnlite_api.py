"""The board runtime's API as the runner calls it, checked against the real rknn-toolkit-lite2.

``rknnlite/api/rknn_lite.py`` is pure Python inside the aarch64 wheel (the runtime itself is a
compiled module next to it), so its signatures can be read here with :mod:`ast` without
importing it.  The wheel is fetched once with ``pip download`` (PyPI) and the file cached under
``~/.cache/rkpart/rknn-toolkit-lite2/<version>/`` (``$RKPART_CACHE_DIR``); the tests skip, saying why, only when
neither the cache nor the download is available.

Checked: the FAKE RKNNLite of the board tests has exactly 2.3.2's signatures and core-mask
constants; the runner's core-mask table is the real one; every call the runner's NPU session
(also what ``rkpart run/profile --backend rknnlite`` use) makes binds to the real signatures
of 2.3.0, 2.3.2 and 2.5.0 (2.5.0 added ``load_rknn(key_path=)`` and ``inference(reuse_outputs=)``).
"""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rkpart.io import default_cache_dir
from rkpart.runtime import board_runner as board
from tests.bundle.fake_rknnlite import FakeRKNNLite

VERSIONS = ("2.3.0", "2.3.2", "2.5.0")
FAKE_VERSION = "2.3.2"
METHODS = ("__init__", "load_rknn", "init_runtime", "inference", "release")
CACHE = default_cache_dir() / "rknn-toolkit-lite2"


def real_rknn_lite(version: str) -> Path:
    """The cached ``rknn_lite.py`` of ``version``, downloading the aarch64 wheel if needed."""
    dest = CACHE / version / "rknn_lite.py"
    if dest.is_file():
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        try:
            p = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--platform",
                                "manylinux_2_17_aarch64", "--only-binary=:all:", "--python-version", "3.11",
                                f"rknn-toolkit-lite2=={version}", "-d", tmp],
                               capture_output=True, text=True, timeout=180)
        except (OSError, subprocess.TimeoutExpired) as e:
            pytest.skip(f"cannot download rknn-toolkit-lite2=={version} (no cached copy in {dest.parent}): {e}")
        wheels = list(Path(tmp).glob("*.whl"))
        if p.returncode != 0 or not wheels:
            last = (p.stderr.strip().splitlines() or ["no wheel"])[-1]
            pytest.skip(f"cannot download rknn-toolkit-lite2=={version} (no cached copy in {dest.parent}): {last}")
        with zipfile.ZipFile(wheels[0]) as z:
            data = z.read("rknnlite/api/rknn_lite.py")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp_file = dest.with_name(f".{dest.name}.{os.getpid()}")
    tmp_file.write_bytes(data)
    os.replace(tmp_file, dest)
    return dest


def _value(node: ast.expr, consts: dict[str, Any]) -> Any:
    if isinstance(node, ast.Name) and node.id in consts:
        return consts[node.id]
    return ast.literal_eval(node)


def real_api(version: str) -> tuple[dict[str, inspect.Signature], dict[str, int]]:
    """Signatures of class ``RKNNLite``'s methods and its ``NPU_CORE_*`` constants, read by :mod:`ast`."""
    tree = ast.parse(real_rknn_lite(version).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RKNNLite")
    consts: dict[str, Any] = {}
    sigs: dict[str, inspect.Signature] = {}
    for node in cls.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            consts[node.targets[0].id] = ast.literal_eval(node.value)
        elif isinstance(node, ast.FunctionDef):
            a = node.args
            assert not a.posonlyargs and not a.kwonlyargs and a.vararg is None and a.kwarg is None, node.name
            defaults = [inspect.Parameter.empty] * (len(a.args) - len(a.defaults)) + [_value(d, consts)
                                                                                       for d in a.defaults]
            sigs[node.name] = inspect.Signature([
                inspect.Parameter(arg.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d)
                for arg, d in zip(a.args, defaults, strict=True)])
    return sigs, {k: v for k, v in consts.items() if k.startswith("NPU_CORE_")}


def test_fake_rknnlite_has_the_real_signatures_and_constants() -> None:
    sigs, consts = real_api(FAKE_VERSION)
    for name in METHODS:
        assert inspect.signature(getattr(FakeRKNNLite, name)) == sigs[name], name
    assert {k: getattr(FakeRKNNLite, k) for k in consts} == consts
    assert len(consts) == 7


@pytest.mark.parametrize("version", VERSIONS)
def test_runner_core_masks_are_the_runtime_constants(version: str) -> None:
    _, consts = real_api(version)
    assert {"auto": consts["NPU_CORE_AUTO"], "0": consts["NPU_CORE_0"],
                                "1": consts["NPU_CORE_1"], "2": consts["NPU_CORE_2"],
                                "0_1": consts["NPU_CORE_0_1"], "0_1_2": consts["NPU_CORE_0_1_2"],
                                "all": consts["NPU_CORE_ALL"]} == board.CORE_MASKS


class _CallLog:
    """Records each call as (method, args, kwargs) and answers like a healthy runtime."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.log: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [("__init__", args, kwargs)]
        _CallLog.last = self

    last: _CallLog

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.log.append((name, args, kwargs))
            return [np.zeros(3, np.float32)] if name == "inference" else 0
        return call


@pytest.mark.parametrize("version", VERSIONS)
def test_runner_npu_calls_bind_to_the_real_signatures(version: str, tmp_path: Path) -> None:
    sigs, _ = real_api(version)
    rknn = tmp_path / "s.rknn"
    rknn.write_bytes(b"\0")
    sess = board.RknnLiteSession(rknn, board.CORE_MASKS["0_1_2"], _CallLog, "s")
    sess.load()
    sess.init()
    out = sess.infer([np.zeros((1, 2, 3, 4), np.float16), np.zeros(3, np.float32)])
    sess.release()
    log = _CallLog.last.log
    assert [c[0] for c in log] == ["__init__", "load_rknn", "init_runtime", "inference", "release"]
    assert len(out) == 1
    for name, args, kwargs in log:
        bound = sigs[name].bind(None, *args, **kwargs)  # None: self; raises TypeError on any mismatch
        if name == "init_runtime":
            assert bound.arguments["core_mask"] == 7
        if name == "inference":
            assert bound.arguments["data_format"] == ["nchw", None]
