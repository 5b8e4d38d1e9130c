"""The bundle runner on hostile bundles and inputs (issue 31): every bad manifest, npz or option
is refused before anything runs, with one line on stderr and exit 2 (docs/board.md); a tampered
bundle never passes its gate.

The bundle is real: the bundled example partitioned with every op on the host (a custom spec;
no toolkit needed) and written by ``rkpart bundle``.  The runner is the bundle's own
``runner.py``, run in-process through its ``main`` and :class:`Runner`, and as a script.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from tests.hostile.models import FUZZ_STATS

Manifest = dict[str, Any]
Mutation = Callable[[Manifest], Any]


@pytest.fixture(autouse=True)
def _no_standin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RKPART_RUNNER_NPU_STANDIN", raising=False)


def _copy(bundle: Path, tmp: Path) -> Path:
    d = tmp / "b"
    shutil.copytree(bundle, d, symlinks=True)
    return d


def _manifest(d: Path) -> Manifest:
    m: Manifest = json.loads((d / "manifest.json").read_text())
    return m


def _write_manifest(d: Path, m: Any) -> None:
    (d / "manifest.json").write_text(json.dumps(m))


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _relist(d: Path, m: Manifest, rel: str) -> None:
    m["files"][rel] = {"sha256": _sha(d / rel), "size": (d / rel).stat().st_size}


def _first_file(m: Manifest) -> str:
    return sorted(m["files"])[0]


def _first_tensor(m: Manifest) -> str:
    return str(m["inputs"][0]["name"])


def _set(path: tuple[Any, ...], value: Any) -> Mutation:
    """Set ``m[path...] = value`` (a path element ``_first_file``/``_first_tensor`` is resolved)."""
    def mut(m: Manifest) -> None:
        node: Any = m
        keys = [k(m) if callable(k) else k for k in path]
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return mut


def _drop(key: str) -> Mutation:
    def mut(m: Manifest) -> None:
        del m[key]
    return mut


def _rename_file_key(new: str) -> Mutation:
    def mut(m: Manifest) -> None:
        k = _first_file(m)
        m["files"][new] = m["files"].pop(k)
    return mut


STAGE0 = ("stages", 0)
#: manifest mutations: (id, mutation); every one must be refused with exit 2 and one line
MANIFEST_CASES: list[tuple[str, Mutation]] = [
    *((f"drop-{k}", _drop(k)) for k in ("files", "tensors", "inputs", "outputs", "stages", "format", "version")),
    *((f"{k}-as-{type(v).__name__}", _set((k,), v))
      for k in ("files", "tensors", "inputs", "outputs", "stages")
      for v in ([], "x", 7, None, True, {"a": 1}) if not (k in ("files", "tensors") and isinstance(v, dict))),
    *((f"gate-as-{type(v).__name__}", _set(("gate",), v)) for v in ([1], "x", 7)),
    *((f"reference-as-{type(v).__name__}", _set(("reference",), v)) for v in ([1], "x", 7)),
    *((f"gate-{k}-{v!r}", _set(("gate", k), v)) for k in ("min_cosine", "max_abs_rel")
      for v in ("0.9", float("nan"), float("inf"), [0.9], True)),
    *((f"version-{v!r}", _set(("version",), v)) for v in (2, "1", 10**30, None)),
    *((f"format-{v!r}", _set(("format",), v)) for v in ("rkpart-plan", 1, None)),
    *((f"file-size-{v!r}", _set(("files", _first_file, "size"), v))
      for v in ("12", -1, 2**70, 1.5, True, None, [1])),
    *((f"file-sha-{v!r}", _set(("files", _first_file, "sha256"), v))
      for v in ("x", 5, None, "A" * 64, "g" * 64, "0" * 63)),
    ("file-entry-list", _set(("files", _first_file), [1, 2])),
    ("file-entry-missing-sha", _set(("files", _first_file), {"size": 1})),
    *((f"file-key-{n}", _rename_file_key(k))
      for n, k in (("nul", "stages/a\0b.onnx"), ("abs", "/etc/passwd"), ("dotdot", "../outside"),
                   ("backslash", "..\\outside"), ("empty", ""), ("long", "a" * 5000))),
    *((f"tensor-dtype-{v!r}", _set(("tensors", _first_tensor, "dtype"), v))
      for v in ("object", "str", "complex64", "float128", "V8", 5, None, "<f4")),
    *((f"tensor-shape-{n}", _set(("tensors", _first_tensor, "shape"), v))
      for n, v in (("str", "abc"), ("neg", [-1]), ("huge", [2**40, 2**40]), ("float", [1.5]), ("bool", [True]),
                   ("nested", [[1]]), ("ndim", [1] * 17), ("none", None), ("digits", [10**30]))),
    ("tensor-entry-str", _set(("tensors", _first_tensor), "float32")),
    *((f"stage-device-{v!r}", _set((*STAGE0, "device"), v)) for v in ("gpu", None, 1, "NPU")),
    *((f"stage-file-{n}", _set((*STAGE0, "file"), v))
      for n, v in (("unlisted", "stages/other.onnx"), ("nul", "stages/x\0.onnx"), ("abs", "/etc/passwd"),
                   ("dotdot", "../../x.onnx"), ("int", 5), ("none", None), ("dir", "stages"))),
    *((f"stage-{k}-{n}", _set((*STAGE0, k), v))
      for k in ("inputs", "outputs")
      for n, v in (("str", "x"), ("ints", [5]), ("unknown", ["no_such_tensor"]), ("none", None))),
    *((f"stage-id-{n}", _set((*STAGE0, "id"), v)) for n, v in (("none", None), ("empty", ""), ("long", "a" * 5000),
                                                              ("nul", "a\0b"), ("list", ["a"]))),
    ("stage-residency-bogus", _set((*STAGE0, "residency"), "sometimes")),
    *((f"stage-precision-{v!r}", _set((*STAGE0, "precision"), v)) for v in ("int4", None, 8, "INT8")),
    ("stage-entry-str", _set(STAGE0, "stage")),
    ("stages-empty", _set(("stages",), [])),
    ("input-name-int", _set(("inputs", 0, "name"), 3)),
    ("input-name-unknown", _set(("inputs", 0, "name"), "nope")),
    ("input-entry-str", _set(("inputs", 0), "x")),
    ("core-mask-bogus", _set(("core_mask",), "3_4")),
    ("reference-unlisted", _set(("reference", "inputs"), "elsewhere.npz")),
    ("reference-dotdot", _set(("reference", "inputs"), "../ref_inputs.npz")),
]


def _raw(text: bytes) -> Callable[[Path], None]:
    def write(d: Path) -> None:
        (d / "manifest.json").write_bytes(text)
    return write


def _fifo(d: Path) -> None:
    (d / "manifest.json").unlink()
    os.mkfifo(d / "manifest.json")


def _devzero(d: Path) -> None:
    (d / "manifest.json").unlink()
    (d / "manifest.json").symlink_to("/dev/zero")


def _folder(d: Path) -> None:
    (d / "manifest.json").unlink()
    (d / "manifest.json").mkdir()


def _missing(d: Path) -> None:
    (d / "manifest.json").unlink()


#: manifests that are not JSON the runner could use at all
RAW_CASES: list[tuple[str, Callable[[Path], None]]] = [
    ("digits", _raw(b'{"format": "rkpart-bundle", "version": ' + b"1" * 5000 + b"}")),
    ("deep", _raw(b"[" * 100_000 + b"]" * 100_000)),
    ("deep-shallow-enough-for-json", _raw(b'{"a":' * 40 + b"1" + b"}" * 40)),
    ("not-utf8", _raw(b"\xff\xfe{}")),
    ("not-json", _raw(b"{format: bundle")),
    ("empty", _raw(b"")),
    ("array", _raw(b"[1, 2, 3]")),
    ("nan-gate", None),  # filled below: a valid manifest with NaN in the gate (JSON accepts NaN)
    ("fifo", _fifo),
    ("devzero", _devzero),
    ("folder", _folder),
    ("missing", _missing),
]


def _nan_gate(bundle: Path) -> Callable[[Path], None]:
    def write(d: Path) -> None:
        m = _manifest(d)
        m["gate"]["min_cosine"] = float("nan")
        (d / "manifest.json").write_text(json.dumps(m))  # json writes NaN
    return write


def _assert_runner_error(rc: int, err: str, code: int = 2) -> str:
    assert rc == code, f"exit {rc}, wanted {code}: {err!r}"
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("runner: error: "), lines
    return lines[0]


def _main(mod: ModuleType, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = mod.main([*args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.slow  # more than 0.3 s a case (pytest --durations), or builds a shared profile
@pytest.mark.parametrize("case", [c[0] for c in MANIFEST_CASES])
def test_bad_manifest_is_one_line_exit_2(case: str, host_bundle: Path, runner_mod: ModuleType, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    d = _copy(host_bundle, tmp_path)
    m = _manifest(d)
    dict(MANIFEST_CASES)[case](m)
    _write_manifest(d, m)
    rc, _out, err = _main(runner_mod, capsys, "--bundle", str(d))
    _assert_runner_error(rc, err)
    # the same manifest through the Python API: the runner's one error type, never another exception
    with pytest.raises(runner_mod.BundleError):
        runner_mod.Runner(d)
    FUZZ_STATS["cases:runner-manifest"] += 2


@pytest.mark.parametrize("case", [c[0] for c in RAW_CASES])
def test_unreadable_manifest_is_one_line_exit_2(case: str, host_bundle: Path, runner_mod: ModuleType,
                                                tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _copy(host_bundle, tmp_path)
    write = dict(RAW_CASES)[case] or _nan_gate(host_bundle)
    write(d)
    if case == "deep-shallow-enough-for-json":
        # 40 levels: over the runner's depth limit of 32, though Python's json would parse it
        assert runner_mod.MAX_JSON_DEPTH < 40
    rc, _out, err = _main(runner_mod, capsys, "--bundle", str(d))
    _assert_runner_error(rc, err)
    with pytest.raises(runner_mod.BundleError):
        runner_mod.Runner(d)
    FUZZ_STATS["cases:runner-manifest"] += 2


# -- npz inputs and references ------------------------------------------------------------------


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def _huge_header_npz(name: str) -> bytes:
    """A member whose header claims 2^40 float32 elements over a few bytes of data."""
    hdr = io.BytesIO()
    np.lib.format.write_array_header_2_0(hdr, {"descr": "<f4", "fortran_order": False, "shape": (1 << 40,)})
    body = b"\x93NUMPY\x02\x00" + hdr.getvalue()[8:] + b"\x00" * 16
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"{name}.npy", body)
    return buf.getvalue()


def _inputs(d: Path) -> dict[str, np.ndarray]:
    with np.load(d / "ref_inputs.npz") as z:
        return {k: z[k] for k in z.files}


def _outputs(d: Path) -> dict[str, np.ndarray]:
    with np.load(d / "ref_outputs.npz") as z:
        return {k: z[k] for k in z.files}


def _npz_case(kind: str, arrays: dict[str, np.ndarray], target: Path) -> None:
    """Write the hostile npz ``kind`` at ``target`` from the good ``arrays``."""
    first = sorted(arrays)[0]
    if kind == "not-zip":
        target.write_bytes(b"not a zip file at all")
    elif kind == "truncated":
        target.write_bytes(_npz_bytes(arrays)[:200])
    elif kind == "pickled-object":
        bad = dict(arrays)
        bad[first] = np.array([{"a": 1}], dtype=object)
        buf = io.BytesIO()
        np.savez(buf, **bad)  # type: ignore[arg-type]  # allow_pickle defaults to True for writing
        target.write_bytes(buf.getvalue())
    elif kind == "huge-header":
        good = _npz_bytes({k: v for k, v in arrays.items() if k != first})
        with zipfile.ZipFile(io.BytesIO(_huge_header_npz(first))) as src:
            body = src.read(f"{first}.npy")
        buf = io.BytesIO(good)
        with zipfile.ZipFile(buf, "a") as z:
            z.writestr(f"{first}.npy", body)
        target.write_bytes(buf.getvalue())
    elif kind == "missing-member":
        target.write_bytes(_npz_bytes({k: v for k, v in arrays.items() if k != first}))
    elif kind == "wrong-shape":
        target.write_bytes(_npz_bytes({**arrays, first: np.zeros((1, 2, 3), np.float32)}))
    elif kind == "string-dtype":
        target.write_bytes(_npz_bytes({**arrays, first: np.array(["a", "b"])}))
    elif kind == "complex-dtype":
        target.write_bytes(_npz_bytes({**arrays, first: arrays[first].astype(np.complex64)}))
    elif kind == "structured-dtype":
        target.write_bytes(_npz_bytes({**arrays, first: np.zeros(3, dtype=[("a", "<f4"), ("b", "<i4")])}))
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "devzero":
        target.symlink_to("/dev/zero")
    elif kind == "folder":
        target.mkdir()
    elif kind == "missing":
        pass
    else:  # pragma: no cover
        raise AssertionError(kind)


NPZ_CASES = ["not-zip", "truncated", "pickled-object", "huge-header", "missing-member", "wrong-shape",
             "string-dtype", "complex-dtype", "structured-dtype", "fifo", "devzero", "folder", "missing"]


@pytest.mark.slow  # more than 0.3 s a case (pytest --durations), or builds a shared profile
@pytest.mark.parametrize("which", ["inputs", "reference"])
@pytest.mark.parametrize("kind", NPZ_CASES)
def test_bad_npz_is_one_line_exit_2(which: str, kind: str, host_bundle: Path, runner_mod: ModuleType,
                                    tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _copy(host_bundle, tmp_path)
    good = _inputs(d) if which == "inputs" else _outputs(d)
    bad = tmp_path / "bad.npz"
    _npz_case(kind, good, bad)
    args = ["--bundle", str(d), f"--{which}", str(bad)]
    if which == "reference":
        args += ["--inputs", str(d / "ref_inputs.npz")]
    rc, _out, err = _main(runner_mod, capsys, *args)
    _assert_runner_error(rc, err)
    FUZZ_STATS["cases:runner-npz"] += 1


@pytest.mark.parametrize("which", ["inputs", "reference"])
@pytest.mark.parametrize("kind", ["huge-header", "pickled-object", "string-dtype"])
def test_unused_npz_members_are_never_decoded(which: str, kind: str, host_bundle: Path, runner_mod: ModuleType,
                                              tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A hostile member the run does not use is left alone: the run passes its gate."""
    d = _copy(host_bundle, tmp_path)
    good = _inputs(d) if which == "inputs" else _outputs(d)
    extra = tmp_path / "extra.npz"
    _npz_case(kind, {"zz_unused": np.zeros(2, np.float32)}, extra)
    merged = tmp_path / "merged.npz"
    buf = io.BytesIO(_npz_bytes(good))
    with zipfile.ZipFile(buf, "a") as z, zipfile.ZipFile(extra) as e:
        for n in e.namelist():
            z.writestr(n, e.read(n))
    merged.write_bytes(buf.getvalue())
    args = ["--bundle", str(d), f"--{which}", str(merged)]
    if which == "reference":
        args += ["--inputs", str(d / "ref_inputs.npz")]
    else:
        args += ["--reference", str(d / "ref_outputs.npz")]
    rc, out, err = _main(runner_mod, capsys, *args)
    assert rc == 0, err
    assert "gate: PASS" in out
    FUZZ_STATS["cases:runner-npz"] += 1


# -- files on disk ------------------------------------------------------------------------------


def _data_file(d: Path) -> Path:
    return sorted((d / "stages").glob("*.onnx.data"))[0]


def _unlist_data(d: Path) -> None:
    m = _manifest(d)
    rel = _data_file(d).relative_to(d).as_posix()
    del m["files"][rel]
    _write_manifest(d, m)


def _extra_in_stages(d: Path) -> None:
    (d / "stages" / "planted.onnx.data").write_bytes(b"\0" * 64)


def _extra_nested(d: Path) -> None:
    (d / "stages" / "sub").mkdir()
    (d / "stages" / "sub" / "x.data").write_bytes(b"1")


def _listed_to_fifo(d: Path) -> None:
    p = _data_file(d)
    p.unlink()
    os.mkfifo(p)


def _listed_to_devzero(d: Path) -> None:
    p = _data_file(d)
    p.unlink()
    p.symlink_to("/dev/zero")


def _listed_edited(d: Path) -> None:
    p = _data_file(d)
    b = bytearray(p.read_bytes())
    b[100] ^= 0xFF
    p.write_bytes(bytes(b))


def _stage_not_onnx(d: Path) -> None:
    """ONNX Runtime refuses the stage: garbage bytes, listed with their own sha256."""
    m = _manifest(d)
    rel = m["stages"][0]["file"]
    (d / rel).write_bytes(b"definitely not an onnx model")
    _relist(d, m, rel)
    _write_manifest(d, m)


def _stage_symlink_out(d: Path) -> None:
    m = _manifest(d)
    rel = m["stages"][0]["file"]
    outside = d.parent / "outside.onnx"
    shutil.copyfile(d / rel, outside)
    (d / rel).unlink()
    (d / rel).symlink_to(outside)


FILE_CASES: list[tuple[str, Callable[[Path], None]]] = [
    ("data-unlisted", _unlist_data), ("planted-data", _extra_in_stages), ("planted-nested", _extra_nested),
    ("listed-fifo", _listed_to_fifo), ("listed-devzero", _listed_to_devzero), ("listed-edited", _listed_edited),
    ("ort-refuses-stage", _stage_not_onnx), ("stage-symlink-outside", _stage_symlink_out),
]


@pytest.mark.parametrize("case", [c[0] for c in FILE_CASES])
def test_tampered_bundle_files_are_refused(case: str, host_bundle: Path, runner_mod: ModuleType, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    d = _copy(host_bundle, tmp_path)
    dict(FILE_CASES)[case](d)
    rc, _out, err = _main(runner_mod, capsys, "--bundle", str(d))
    _assert_runner_error(rc, err)
    FUZZ_STATS["cases:runner-files"] += 1


@pytest.mark.parametrize("scale", [1.01, 0.99, 1.05])
def test_weights_scaled_by_one_percent_fail_the_default_gate(scale: float, host_bundle: Path,
                                                             runner_mod: ModuleType, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Weights edited and re-listed with their new sha256 (a consistent but wrong bundle): the
    cosine alone passes such a change, the default relative max-abs bound does not."""
    d = _copy(host_bundle, tmp_path)
    p = _data_file(d)
    a = np.fromfile(p, dtype=np.float32)
    (a * np.float32(scale)).astype(np.float32).tofile(p)
    m = _manifest(d)
    _relist(d, m, p.relative_to(d).as_posix())
    _write_manifest(d, m)
    rc, out, err = _main(runner_mod, capsys, "--bundle", str(d), "--json")
    assert rc == 8, err
    rep = json.loads(out)
    assert not rep["passed"] and any("max abs error / max |reference|" in f for f in rep["failures"])
    if abs(scale - 1) <= 0.01:  # the cosine, all the old default gate looked at, passes a 1 % change
        assert all(r["cosine"] > 0.999 for r in rep["outputs"].values())
    FUZZ_STATS["cases:runner-files"] += 1


def _chardev(p: Path) -> None:
    os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a private /dev/null


SAVE_CASES: list[tuple[str, Callable[[Path], str]]] = [
    ("folder", lambda t: (t / "out").mkdir() or str(t / "out")),
    ("missing-parent", lambda t: str(t / "no" / "such" / "out.npz")),
    ("symlink", lambda t: (t / "victim.npz").write_bytes(b"keep") and ((t / "link.npz").symlink_to(t / "victim.npz")
                                                                       or str(t / "link.npz"))),
    ("nul", lambda t: str(t / "a\0b.npz")),
    ("fifo", lambda t: os.mkfifo(t / "fifo.npz") or str(t / "fifo.npz")),
    ("empty", lambda t: ""),
]
if os.geteuid() == 0:
    SAVE_CASES.append(("chardev", lambda t: _chardev(t / "null.npz") or str(t / "null.npz")))


@pytest.mark.parametrize("case", [c[0] for c in SAVE_CASES])
def test_bad_save_outputs_is_refused_before_running(case: str, host_bundle: Path, runner_mod: ModuleType,
                                                    tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _copy(host_bundle, tmp_path)
    work = tmp_path / "w"
    work.mkdir()
    target = dict(SAVE_CASES)[case](work)
    before = sorted(os.listdir(work))
    rc, out, err = _main(runner_mod, capsys, "--bundle", str(d), "--save-outputs", target)
    _assert_runner_error(rc, err)
    assert "pass 0" not in out  # refused before any stage ran
    assert sorted(os.listdir(work)) == before
    if case == "symlink":
        assert (work / "victim.npz").read_bytes() == b"keep"
    FUZZ_STATS["cases:runner-options"] += 1


def test_save_outputs_replaces_only_a_file_the_runner_wrote_and_atomically(
        host_bundle: Path, runner_mod: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """issue 51: an existing --save-outputs is replaced only with --force and only if the runner wrote
    it (the .npz's zip comment); a user's file is refused, --force or not, and left as it was."""
    d = _copy(host_bundle, tmp_path)
    target = tmp_path / "out.npz"
    target.write_bytes(b"old")
    for force in ((), ("--force",)):
        rc, _out, err = _main(runner_mod, capsys, "--bundle", str(d), "--save-outputs", str(target), *force)
        _assert_runner_error(rc, err)
        assert target.read_bytes() == b"old"
    target.unlink()
    rc, _out, err = _main(runner_mod, capsys, "--bundle", str(d), "--save-outputs", str(target))
    assert rc == 0, err
    rc, _out, err = _main(runner_mod, capsys, "--bundle", str(d), "--save-outputs", str(target))
    _assert_runner_error(rc, err)  # exists, no --force
    rc, _out, err = _main(runner_mod, capsys, "--bundle", str(d), "--save-outputs", str(target), "--force")
    assert rc == 0, err
    with np.load(target) as z:
        ref = _outputs(d)
        assert set(z.files) == set(ref) and all(np.allclose(z[k], ref[k]) for k in ref)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "out.npz"]  # no temp file left


@pytest.mark.parametrize("args", [("--min-cosine", "nan"), ("--max-abs-rel", "inf"), ("--max-abs-rel", "nan"),
                                  ("--passes", "0"), ("--passes", "-3")])
def test_absurd_runner_options_are_one_line(args: tuple[str, str], host_bundle: Path, runner_mod: ModuleType,
                                            tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _copy(host_bundle, tmp_path)
    rc, _out, err = _main(runner_mod, capsys, "--bundle", str(d), *args)
    _assert_runner_error(rc, err)
    FUZZ_STATS["cases:runner-options"] += 1


# -- Runner.run from Python ---------------------------------------------------------------------


def _feed_cases(good: dict[str, np.ndarray]) -> list[tuple[str, dict[str, Any]]]:
    first = sorted(good)[0]
    cases: list[tuple[str, dict[str, Any]]] = [
        ("missing", {k: v for k, v in good.items() if k != first}),
        ("wrong-shape", {**good, first: np.zeros((2, 2), np.float32)}),
        ("strings", {**good, first: np.full(good[first].shape, "x")}),
        ("objects", {**good, first: np.empty(good[first].shape, dtype=object)}),
        ("complex", {**good, first: good[first].astype(np.complex64)}),
        ("scalar", {**good, first: 1.0}),
        ("none", {**good, first: None}),
    ]
    return cases


@pytest.mark.parametrize("case", ["missing", "wrong-shape", "strings", "objects", "complex", "scalar", "none"])
def test_runner_run_refuses_bad_feeds(case: str, host_bundle: Path, runner_mod: ModuleType) -> None:
    good = _inputs(host_bundle)
    feeds = dict(_feed_cases(good))[case]
    with runner_mod.Runner(host_bundle) as r, pytest.raises(runner_mod.BundleError):
        r.run(feeds)
    FUZZ_STATS["cases:runner-api"] += 1


def test_runner_run_gives_the_reference_on_good_feeds(host_bundle: Path, runner_mod: ModuleType) -> None:
    with runner_mod.Runner(host_bundle) as r:
        out = r.run(_inputs(host_bundle))
    ref = _outputs(host_bundle)
    assert set(out) == set(ref)
    for k in ref:
        m = runner_mod.compare(out[k], ref[k])
        assert m["cosine"] > 0.99999 and m["nonfinite"] == 0


# -- the runner as the script the board runs ----------------------------------------------------

SCRIPT_CASES = ["drop-files", "files-as-list", "file-size-'12'", "file-key-nul", "tensor-dtype-'object'",
                "stage-file-unlisted", "version-1000000000000000000000000000000"]


#: three cases in the fast tier (one per kind of file), the rest in the slow one: each is a process
_SCRIPT_FAST = {"drop-files", "file:data-unlisted", "npz:huge-header"}


@pytest.mark.parametrize("case", [
    c if c in _SCRIPT_FAST else pytest.param(c, marks=pytest.mark.slow)
    for c in [*SCRIPT_CASES, "raw:digits", "raw:deep", "file:data-unlisted", "file:ort-refuses-stage",
              "npz:huge-header"]])
def test_runner_script_exits_2_with_one_line(case: str, host_bundle: Path, tmp_path: Path) -> None:
    d = _copy(host_bundle, tmp_path)
    extra: list[str] = []
    if case.startswith("raw:"):
        f = dict(RAW_CASES)[case[4:]]
        assert f is not None
        f(d)
    elif case.startswith("file:"):
        dict(FILE_CASES)[case[5:]](d)
    elif case.startswith("npz:"):
        _npz_case(case[4:], _inputs(d), tmp_path / "in.npz")
        extra = ["--inputs", str(tmp_path / "in.npz")]
    else:
        m = _manifest(d)
        dict(MANIFEST_CASES)[case](m)
        _write_manifest(d, m)
    env = {k: v for k, v in os.environ.items() if k not in ("RKPART_RUNNER_NPU_STANDIN", "PYTHONPATH")}
    r = subprocess.run([sys.executable, str(d / "runner.py"), *extra], cwd=d, env=env, capture_output=True,
                       text=True, timeout=120)
    _assert_runner_error(r.returncode, r.stderr)
    FUZZ_STATS["cases:runner-script"] += 1


def test_every_case_id_is_distinct() -> None:
    for cases in (MANIFEST_CASES, RAW_CASES, FILE_CASES, SAVE_CASES):
        ids = [c[0] for c in cases]
        assert len(ids) == len(set(ids)), ids
    assert set(SCRIPT_CASES) <= {c[0] for c in MANIFEST_CASES}


def test_docs_errors_lists_the_runner_s_exit_codes(runner_mod: ModuleType) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text()
    section = doc.split("## The bundle runner", 1)[1].split("\n## ", 1)[0]
    codes = {int(c) for c in re.findall(r"^\|\s*(\d+)\s*\|", section, re.M)}
    assert codes == {0, runner_mod.EXIT_USER, runner_mod.EXIT_RUNTIME, runner_mod.EXIT_GATE, 130}
