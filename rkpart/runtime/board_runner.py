"""Run an rkpart bundle on an RK3588 board: NPU stages with RKNNLite, host stages with ONNX Runtime.

This one file is copied into every bundle written by ``rkpart bundle`` (as ``runner.py``) and
is all the board needs besides the bundle's model files; inside rkpart it is
``rkpart.runtime.board_runner``, whose NPU session ``rkpart run/profile --backend rknnlite``
use.  It imports nothing from rkpart.  It imports only the standard library, NumPy,
ONNX Runtime and (for NPU stages) rknn-toolkit-lite2, so a board image needs just::

    pip install numpy onnxruntime rknn-toolkit-lite2

Use it from Python, e.g. in a denoising loop::

    from runner import Runner
    with Runner("bundle/") as r:          # checks every file against manifest.json
        for t in timesteps:
            out = r.run({"hidden_states": x, "timestep": t, "encoder_hidden_states": ctx})
            x = scheduler_step(out["sample"], x, t)

or from the shell, gated against the reference outputs the bundle was written with::

    python runner.py --inputs ref_inputs.npz --reference ref_outputs.npz

Residency (``manifest.json`` ``residency`` per stage, ``--residency`` overrides all):
``per-stage`` stages are loaded, initialised, run and released around every use (one NPU
context alive at a time, the policy for boards with little memory); ``resident`` stages
are loaded and initialised once, when the runner opens, and released by :meth:`Runner.close`.
Host stages always stay resident (ONNX Runtime sessions on the CPU).

ONNX Runtime stand-in: with ``RKPART_RUNNER_NPU_STANDIN=DIR`` in the environment (or
``npu_standin=DIR``), NPU stages run on ONNX Runtime from the stage ``.onnx`` files found
under ``DIR`` at each stage's ``source`` path (the plan folder the bundle was made from).
That is for checking a bundle on a machine without an NPU; it is never the NPU.

Exit codes of the command line: 0 gate passed, 2 bad input (one-line message), 7 the NPU
runtime failed, 8 the numerical gate failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

try:
    import numpy as np
except ImportError as _e:  # pragma: no cover - the board image lacks numpy
    if __name__ == "__main__":
        print(f"runner: error: the runner needs numpy (pip install numpy onnxruntime rknn-toolkit-lite2): {_e}",
              file=sys.stderr)
        sys.exit(2)
    raise

MANIFEST = "manifest.json"
BUNDLE_FORMAT = "rkpart-bundle"
BUNDLE_VERSION = 1
STANDIN_ENV = "RKPART_RUNNER_NPU_STANDIN"
RESIDENCIES = ("per-stage", "resident")

#: ``--core-mask`` names and RKNNLite's values (rknn_api.h ``rknn_core_mask``).
CORE_MASKS = {
    "auto": 0,
    "0": 1,
    "1": 2,
    "2": 4,
    "0_1": 3,
    "0_1_2": 7,
    "all": 0xFFFF,
}

EXIT_USER, EXIT_RUNTIME, EXIT_GATE = 2, 7, 8
#: the gate's max |error| / max |reference| when the manifest names none: fp16 on the NPU (the
#: simulator) gives ~6e-4 on the example, host weights scaled by 1.01 give ~2e-2
DEFAULT_MAX_ABS_REL = 0.01


class BundleError(Exception):
    """A problem with the bundle, the inputs or the options; reported as one line (exit 2)."""

    exit_code = EXIT_USER


class RuntimeFailure(BundleError):
    """The NPU runtime (RKNNLite) refused a stage (exit 7)."""

    exit_code = EXIT_RUNTIME


# ---------------------------------------------------------------------------------------------
# sessions: one per stage, with the RKNN runtime's lifecycle load -> init -> infer* -> release


def ort_session(path: str) -> Any:
    """An ONNX Runtime CPU session with rkpart's settings (sequential execution, no spinning, quiet)."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise BundleError(f"host stages need onnxruntime (pip install onnxruntime): {e}") from None

    so = ort.SessionOptions()
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    # no busy-waiting worker threads between calls: the board's CPU also runs the host stages
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])


class OrtSession:
    """A stage on ONNX Runtime (host stages; NPU stages under the stand-in)."""

    def __init__(self, path: Path, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> None:
        self.path, self.inputs, self.outputs = path, inputs, outputs
        self._sess: Any = None

    def load(self) -> None:
        if not self.path.is_file():
            raise BundleError(f"stage file {self.path} is missing")

    def init(self) -> None:
        try:
            self._sess = ort_session(str(self.path))
        except BundleError:
            raise
        except Exception as e:  # noqa: BLE001 - ONNX Runtime's types (Fail, InvalidGraph...) derive from Exception
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise BundleError(f"ONNX Runtime cannot load stage file {self.path}: {first[:300]}") from None

    def infer(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        try:
            return list(self._sess.run(list(self.outputs), dict(zip(self.inputs, arrays, strict=True))))
        except Exception as e:  # noqa: BLE001 - as in init: ONNX Runtime's error types
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise RuntimeFailure(f"ONNX Runtime failed on stage file {self.path}: {first[:300]}") from None

    def release(self) -> None:
        self._sess = None


def import_rknnlite() -> Any:
    try:
        from rknnlite.api import RKNNLite
    except ImportError as e:
        raise RuntimeFailure(
            f"running .rknn stages needs rknn-toolkit-lite2 on the board (pip install rknn-toolkit-lite2): {e}"
        ) from None
    return RKNNLite


class RknnLiteSession:
    """A compiled ``.rknn`` stage on the NPU: each lifecycle method is one RKNNLite call."""

    def __init__(self, path: Path, core_mask: int, api: Any = None, name: str = "") -> None:
        self.path, self.core_mask, self.name = path, core_mask, name or path.name
        self._api = api
        self._rknn: Any = None

    def load(self) -> None:
        api = self._api or import_rknnlite()
        self._rknn = api(verbose=False)
        ret = self._rknn.load_rknn(str(self.path))
        if ret != 0:
            raise RuntimeFailure(f"stage {self.name}: load_rknn({self.path}) returned {ret}")

    def init(self) -> None:
        ret = self._rknn.init_runtime(core_mask=self.core_mask)
        if ret != 0:
            raise RuntimeFailure(
                f"stage {self.name}: init_runtime returned {ret} "
                "(an 'Invalid RKNN model version' log line means the board runtime is older than the toolkit)"
            )

    def infer(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        arrays = [np.ascontiguousarray(a) for a in arrays]
        # 4-D inputs are given as NCHW like the ONNX graph; the runtime converts them itself.
        fmt = ["nchw" if a.ndim == 4 else None for a in arrays]
        outs = self._rknn.inference(inputs=arrays, data_format=fmt if any(fmt) else None)
        if outs is None:
            raise RuntimeFailure(f"stage {self.name}: inference returned no outputs")
        return list(outs)

    def release(self) -> None:
        if self._rknn is not None:
            self._rknn.release()
            self._rknn = None


# ---------------------------------------------------------------------------------------------
# the bundle


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while buf := f.read(1 << 22):
            h.update(buf)
    return h.hexdigest()


def inside(root: Path, rel: str) -> Path:
    """``root/rel``, refusing paths that leave ``root``."""
    pp = PurePosixPath(rel)
    if pp.is_absolute() or ".." in pp.parts or os.path.isabs(rel):
        raise BundleError(f"manifest names {rel!r}, which leaves the bundle")
    full = (root / rel).resolve()
    if root.resolve() not in full.parents:
        raise BundleError(f"manifest names {rel!r}, which leaves the bundle")
    return root / rel


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    if not os.path.lexists(path):
        raise BundleError(f"no {MANIFEST} in {folder}: not an rkpart bundle")
    m = load_json(path, "manifest")
    if not isinstance(m, dict) or m.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{path} is not an rkpart bundle manifest")
    if m.get("version") != BUNDLE_VERSION:
        raise BundleError(f"{path} has bundle version {repr(m.get('version'))[:40]}; this runner reads "
                          f"{BUNDLE_VERSION}")
    validate_manifest(m)
    return m


# -- validating what the runner reads (issue 31): whole files, up front, one-line errors ---------
# The runner cannot import rkpart, so its checks live here: only regular files, size limits,
# integer, depth and string limits, and the manifest's schema, before any field is used.

#: limits of what a bundle may hold
MAX_MANIFEST_BYTES = 64 << 20
MAX_JSON_DEPTH = 32
MAX_INT_DIGITS = 20
MAX_NAME_CHARS = 4096
MAX_FILE_BYTES = 1 << 46  # 64 TiB: more than any board holds
MAX_TENSOR_ELEMENTS = 1 << 34
#: tensor dtypes the runner accepts (numerical only: no object arrays, strings or structures)
DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
          "uint64", "bool")
#: bundle files the runner itself does not open (besides those ``files`` lists)
UNLISTED_OK = (MANIFEST, ".rkpart-output.json")


def regular_file(path: Path, what: str) -> os.stat_result:
    """``os.stat`` of ``path`` if it is a regular file (a FIFO would block, /dev/zero never ends)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise BundleError(f"{what} {path} does not exist") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise BundleError(f"cannot read {what} {path!r}: {e}") from None
    import stat as _stat

    if not _stat.S_ISREG(st.st_mode):
        raise BundleError(f"{what} {path} is not a regular file")
    return st


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer with {len(text.lstrip('-'))} digits")
    return int(text)


def _check_depth(doc: Any, what: str) -> None:
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (dict, list)):
            if d > MAX_JSON_DEPTH:
                raise BundleError(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep")
            stack.extend((y, d + 1) for y in (x.values() if isinstance(x, dict) else x))


def load_json(path: Path, what: str, max_bytes: int = MAX_MANIFEST_BYTES) -> Any:
    """A JSON file, whole and bounded: regular file, size, integer digits, nesting depth."""
    st = regular_file(path, what)
    if st.st_size > max_bytes:
        raise BundleError(f"{what} {path} is too large ({st.st_size} bytes; the limit is {max_bytes})")
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
        doc = json.loads(raw.decode("utf-8"), parse_int=_parse_int)
    except RecursionError:
        raise BundleError(f"{what} {path} is nested too deeply") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise BundleError(f"{path} is not readable JSON: {str(e).splitlines()[0] if str(e) else e!r}") from None
    _check_depth(doc, f"{what} {path}")
    return doc


def _name(x: Any, what: str) -> str:
    if not isinstance(x, str) or not x or len(x) > MAX_NAME_CHARS or "\0" in x:
        shown = repr(x)[:80]
        raise BundleError(f"manifest: {what} must be a non-empty string without NUL bytes (at most "
                          f"{MAX_NAME_CHARS} characters), got {shown}")
    return x


def _int(x: Any, what: str, lo: int = 0, hi: int = MAX_FILE_BYTES) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
        raise BundleError(f"manifest: {what} must be an integer in [{lo}, {hi}], got {repr(x)[:80]}")
    return x


def _obj(x: Any, what: str) -> dict[str, Any]:
    if not isinstance(x, dict):
        raise BundleError(f"manifest: {what} must be an object, got {type(x).__name__}")
    return x


def _list(x: Any, what: str) -> list[Any]:
    if not isinstance(x, list):
        raise BundleError(f"manifest: {what} must be a list, got {type(x).__name__}")
    return x


def _relpath(rel: str, what: str) -> str:
    pp = PurePosixPath(rel)
    if pp.is_absolute() or os.path.isabs(rel) or ".." in pp.parts or "\\" in rel:
        raise BundleError(f"manifest names {rel!r}, which leaves the bundle")
    return rel


def validate_manifest(m: Mapping[str, Any]) -> None:
    """Refuse a manifest any later step would trip over: the schema of every field the runner uses.

    Every stage file must be listed in ``files`` (with its sha256), so nothing the runner opens
    escapes the check.
    """
    files = _obj(m.get("files"), "'files'")
    for rel, info in files.items():
        _relpath(_name(rel, "a file name"), "file")
        info = _obj(info, f"files[{rel!r}]")
        sha = info.get("sha256")
        if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise BundleError(f"manifest: files[{rel!r}].sha256 must be 64 lowercase hex digits")
        _int(info.get("size"), f"files[{rel!r}].size")
    tensors = _obj(m.get("tensors"), "'tensors'")
    for name, t in tensors.items():
        _name(name, "a tensor name")
        t = _obj(t, f"tensors[{name!r}]")
        shape = _list(t.get("shape"), f"tensors[{name!r}].shape")
        if len(shape) > 16:
            raise BundleError(f"manifest: tensors[{name!r}].shape has {len(shape)} dimensions (at most 16)")
        n = 1
        for d in shape:
            n *= _int(d, f"tensors[{name!r}].shape", 0, MAX_TENSOR_ELEMENTS)
        if n > MAX_TENSOR_ELEMENTS:
            raise BundleError(f"manifest: tensors[{name!r}] has {n} elements (at most {MAX_TENSOR_ELEMENTS})")
        if t.get("dtype") not in DTYPES:
            raise BundleError(f"manifest: tensors[{name!r}].dtype {repr(t.get('dtype'))[:40]} is not one of "
                              f"{', '.join(DTYPES)}")
    for key in ("inputs", "outputs"):
        for i, t in enumerate(_list(m.get(key), f"'{key}'")):
            tname = _name(_obj(t, f"{key}[{i}]").get("name"), f"{key}[{i}].name")
            if tname not in tensors:
                raise BundleError(f"manifest: {key[:-1]} {tname!r} has no entry in 'tensors'")
    if not m["outputs"]:
        raise BundleError("manifest: 'outputs' is empty (nothing to run for)")
    stages = _list(m.get("stages"), "'stages'")
    if not stages:
        raise BundleError("manifest: 'stages' is empty")
    for i, s in enumerate(stages):
        s = _obj(s, f"stages[{i}]")
        sid = _name(s.get("id"), f"stages[{i}].id")
        if s.get("device") not in ("npu", "host"):
            raise BundleError(f"manifest: stage {sid}: device {repr(s.get('device'))[:40]} is not npu or host")
        f = _relpath(_name(s.get("file"), f"stage {sid} file"), "file")
        if f not in files:
            raise BundleError(f"manifest: stage {sid} file {f!r} is not listed in 'files' (no sha256 to check it by)")
        for key in ("inputs", "outputs"):
            for t in _list(s.get(key), f"stage {sid} {key}"):
                if _name(t, f"stage {sid} {key[:-1]}") not in tensors:
                    raise BundleError(f"manifest: stage {sid} {key[:-1]} {t!r} has no entry in 'tensors'")
        if "residency" in s and s["residency"] not in RESIDENCIES:
            raise BundleError(f"manifest: stage {sid}: residency {repr(s['residency'])[:40]} is not one of "
                              f"{', '.join(RESIDENCIES)}")
        if s["device"] == "npu" and "source" in s:
            _relpath(_name(s["source"], f"stage {sid} source"), "source")
        if s.get("source_sha256") is not None and not isinstance(s["source_sha256"], str):
            raise BundleError(f"manifest: stage {sid}: source_sha256 must be a string")
    # data flow: every stage reads only model inputs and earlier stages' outputs
    have = {t["name"] for t in m["inputs"]}
    for s in stages:
        missing = [t for t in s["inputs"] if t not in have]
        if missing:
            raise BundleError(f"manifest: stage {s['id']} reads {missing[0]!r}, which no model input or earlier "
                              "stage gives")
        have.update(s["outputs"])
    for t in m["outputs"]:
        if t["name"] not in have:
            raise BundleError(f"manifest: model output {t['name']!r} is given by no stage")
    gate = _obj(m.get("gate") or {}, "'gate'")
    for k in ("min_cosine", "max_abs_rel"):
        v = gate.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v != v
                              or v in (float("inf"), float("-inf"))):
            raise BundleError(f"manifest: gate.{k} must be a finite number or null, got {repr(v)[:40]}")
    ref = _obj(m.get("reference") or {}, "'reference'")
    for k in ("inputs", "outputs"):
        if ref.get(k) is not None:
            rel = _relpath(_name(ref[k], f"reference.{k}"), "reference")
            if rel not in files:
                raise BundleError(f"manifest: reference {k} {rel!r} is not listed in 'files'")
    if "core_mask" in m and m["core_mask"] not in CORE_MASKS:
        raise BundleError(f"manifest: core_mask {repr(m['core_mask'])[:40]} is not one of {', '.join(CORE_MASKS)}")


def unlisted_files(folder: Path, manifest: Mapping[str, Any]) -> list[str]:
    """Files in the folders of the stage files (``stages/``, ``rknn/``...) that ``files`` does not
    list: ONNX Runtime would open an unlisted ``.data`` file next to a stage without any check."""
    listed = set(manifest["files"])
    tops = sorted({PurePosixPath(s["file"]).parts[0] for s in manifest["stages"]
                   if len(PurePosixPath(s["file"]).parts) > 1})
    out = []
    for top in tops:
        base = folder / top
        if not base.is_dir() or base.is_symlink():
            continue
        for root, dirs, names in os.walk(base, followlinks=False):
            dirs.sort()
            for n in sorted(names) + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                rel = (Path(root) / n).relative_to(folder).as_posix()
                if rel not in listed and n not in UNLISTED_OK:
                    out.append(rel)
    return out


def verify_files(folder: Path, manifest: Mapping[str, Any]) -> None:
    """Check every file the manifest lists: present, same size, same sha256."""
    for rel, info in sorted(manifest["files"].items()):
        p = inside(folder, rel)
        if not os.path.lexists(p):
            raise BundleError(f"bundle file {rel} is missing")
        regular_file(p, "bundle file")
        if p.stat().st_size != int(info["size"]) or sha256_file(p) != info["sha256"]:
            raise BundleError(f"bundle file {rel} differs from the manifest (sha256); copy the bundle again")
    extra = unlisted_files(folder, manifest)
    if extra:
        raise BundleError(f"bundle file {extra[0]} is not listed in the manifest (no sha256 to check it by"
                          f"{f'; {len(extra)} such files' if len(extra) > 1 else ''}); copy the bundle again")


def standin_file(folder: Path, rel: str, sha256: str | None) -> Path:
    """The ``.onnx`` of an NPU stage for the ONNX Runtime stand-in, checked against the stage's sha256.

    The stage digest is the sha256 of the ``.onnx`` bytes followed by its ``.data`` bytes (if any).
    """
    src = inside(folder, rel)
    if not src.is_file():
        raise BundleError(f"ONNX Runtime stand-in: no {rel} under {folder}")
    if sha256 is not None:
        h = hashlib.sha256()
        for p in (src, src.with_name(src.name + ".data")):
            if p.is_file():
                with open(p, "rb") as f:
                    while buf := f.read(1 << 22):
                        h.update(buf)
        if h.hexdigest() != sha256:
            raise BundleError(f"ONNX Runtime stand-in: {src} is not the stage the bundle was made from (sha256)")
    return src


class Runner:
    """Runs a bundle pass by pass; keep one open for a whole denoising loop.

    ``residency`` and ``core_mask`` override the manifest's; ``npu_standin`` (a folder)
    replaces the NPU by ONNX Runtime on the stages' ``.onnx`` files (never the board's way).
    """

    def __init__(self, folder: str | os.PathLike[str] = ".", *, residency: str | None = None,
                 core_mask: str | None = None, npu_standin: str | os.PathLike[str] | None = None,
                 verify: bool = True, rknnlite_api: Any = None) -> None:
        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder)
        if verify:
            verify_files(self.folder, self.manifest)
        if residency is not None and residency not in RESIDENCIES:
            raise BundleError(f"residency {residency!r} is not one of {', '.join(RESIDENCIES)}")
        self.core_mask = core_mask or str(self.manifest.get("core_mask", "auto"))
        if self.core_mask not in CORE_MASKS:
            raise BundleError(f"core mask {self.core_mask!r} is not one of {', '.join(CORE_MASKS)}")
        if npu_standin is None:
            npu_standin = os.environ.get(STANDIN_ENV) or None
        self.npu_standin = Path(npu_standin) if npu_standin is not None else None
        self.inputs = tuple(t["name"] for t in self.manifest["inputs"])
        self.outputs = tuple(t["name"] for t in self.manifest["outputs"])
        self.tensors: dict[str, dict[str, Any]] = dict(self.manifest["tensors"])
        self.stages: list[dict[str, Any]] = list(self.manifest["stages"])
        # per stage, the tensors no later stage reads (model outputs excepted): a pass drops them
        # after that stage, so it holds only live tensors (a full-size pass is ~10 GB otherwise)
        last: dict[str, int] = {}
        for k, s in enumerate(self.stages):
            for t in (*s["inputs"], *s["outputs"]):
                last[t] = k
        self._drop: list[list[str]] = [[] for _ in self.stages]
        for t, k in last.items():
            if t not in self.outputs:
                self._drop[k].append(t)
        self.residency = {
            s["id"]: "resident" if s["device"] == "host" else (residency or s.get("residency", "per-stage"))
            for s in self.stages
        }
        self._api = rknnlite_api
        self._open: dict[str, Any] = {}  # stage id -> initialised session (resident stages)
        self._opened = False
        #: seconds per (stage id, phase) of the last :meth:`run`, phases load/init/infer/release
        self.timings: list[tuple[str, str, float]] = []
        #: the same for :meth:`open` (resident stages' load/init) and :meth:`close` (their release)
        self.open_timings: list[tuple[str, str, float]] = []
        self.close_timings: list[tuple[str, str, float]] = []
        self._sink = self.timings

    # -- sessions ---------------------------------------------------------------------------
    def _session(self, s: Mapping[str, Any]) -> Any:
        ins, outs = tuple(s["inputs"]), tuple(s["outputs"])
        if s["device"] != "npu":
            return OrtSession(inside(self.folder, s["file"]), ins, outs)
        if self.npu_standin is not None:
            return OrtSession(standin_file(self.npu_standin, s["source"], s.get("source_sha256")), ins, outs)
        if self._api is None:
            self._api = import_rknnlite()
        return RknnLiteSession(inside(self.folder, s["file"]), CORE_MASKS[self.core_mask], self._api, s["id"])

    def _timed(self, sid: str, phase: str, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args)
        self._sink.append((sid, phase, time.perf_counter() - t0))
        return out

    def _start(self, s: Mapping[str, Any]) -> Any:
        sess = self._session(s)
        self._timed(s["id"], "load", sess.load)
        self._timed(s["id"], "init", sess.init)
        return sess

    def open(self) -> Runner:
        """Load and initialise every resident NPU stage (in plan order); host stages start on first use."""
        if not self._opened:
            self._opened = True
            self.open_timings = self._sink = []
            for s in self.stages:
                if s["device"] == "npu" and self.residency[s["id"]] == "resident":
                    self._open[s["id"]] = self._start(s)
        return self

    def close(self) -> None:
        """Release every resident session."""
        self.close_timings = self._sink = []
        for sid, sess in list(self._open.items()):
            self._timed(sid, "release", sess.release)
        self._open.clear()
        self._opened = False

    def __enter__(self) -> Runner:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running ----------------------------------------------------------------------------
    def check_inputs(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        feeds = {}
        for n in self.inputs:
            if n not in inputs:
                raise BundleError(f"missing input {n!r} (the model's inputs: {', '.join(self.inputs)})")
            info = self.tensors[n]
            a = np.asarray(inputs[n])
            if tuple(a.shape) != tuple(info["shape"]):
                raise BundleError(f"input {n!r}: shape {tuple(a.shape)}, the model wants {tuple(info['shape'])}")
            want = np.dtype(info["dtype"])
            if a.dtype.kind not in "biuf" or want.kind not in "biuf":
                raise BundleError(f"input {n!r}: dtype {a.dtype} cannot be used as {want}")
            feeds[n] = a.astype(want, copy=False)
        return feeds

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """One pass through every stage in order; returns the model outputs by name."""
        self.open()
        self.timings = self._sink = []
        env = self.check_inputs(inputs)
        for k, s in enumerate(self.stages):
            sid = s["id"]
            resident = self.residency[sid] == "resident"
            sess = self._open.get(sid)
            if sess is None:
                sess = self._start(s)
                if resident:
                    self._open[sid] = sess
            try:
                outs = self._timed(sid, "infer", sess.infer, [env[n] for n in s["inputs"]])
            finally:
                if not resident:
                    self._timed(sid, "release", sess.release)
            if len(outs) != len(s["outputs"]):
                raise RuntimeFailure(f"stage {sid}: {len(outs)} outputs, expected {len(s['outputs'])}")
            for name, a in zip(s["outputs"], outs, strict=True):
                env[name] = self._conform(name, np.asarray(a))
            for name in self._drop[k]:
                env.pop(name, None)
        return {n: env[n] for n in self.outputs}

    def _conform(self, name: str, a: np.ndarray) -> np.ndarray:
        """The runtime's output in the dtype and shape the plan recorded (RKNN returns float32, flat shapes)."""
        info = self.tensors.get(name)
        if info is None:
            return a
        shape, dtype = tuple(info["shape"]), np.dtype(info["dtype"])
        if a.shape != shape and a.size == int(np.prod(shape, dtype=np.int64)):
            a = a.reshape(shape)
        return a.astype(dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# gating and the command line


def compare(actual: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    a = np.asarray(actual, dtype=np.float64).ravel()
    b = np.asarray(ref, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise BundleError(f"output has {a.size} values, the reference {b.size}")
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    cos = float(a @ b / (na * nb)) if na and nb else (1.0 if na == nb else 0.0)
    max_abs = float(np.max(np.abs(a - b))) if a.size else 0.0
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    return {"cosine": cos, "max_abs": max_abs, "max_abs_rel": max_abs / scale if scale else max_abs,
            "nonfinite": int(np.count_nonzero(~np.isfinite(a)))}


def load_npz(path: str | os.PathLike[str], what: str,
             names: tuple[str, ...] | list[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays ``names`` (default: all) of the ``.npz`` at ``path``; other members are never decoded.

    Each member's header is read first: an object dtype, or a shape needing more bytes than the
    member holds (a 2^40-element header on a few bytes), is refused before anything is allocated.
    """
    import zipfile

    p = Path(path)
    if not os.path.lexists(p):
        raise BundleError(f"{what} file {p} does not exist")
    regular_file(p, f"{what} file")
    fmt = np.lib.format
    out: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(p) as zf:
            members = {n[: -len(".npy")]: n for n in zf.namelist() if n.endswith(".npy")}
            for k in (sorted(members) if names is None else [n for n in names if n in members]):
                info = zf.getinfo(members[k])
                with zf.open(info) as f:
                    version = fmt.read_magic(f)
                    shape, _fortran, dtype = (fmt.read_array_header_1_0(f) if version == (1, 0)
                                              else fmt.read_array_header_2_0(f))
                    if dtype.hasobject or dtype.fields is not None or dtype.kind not in "biuf":
                        raise BundleError(f"{what} {p}: array {k!r} has dtype {dtype}, not a numeric one")
                    n = 1
                    for d in shape:
                        n *= int(d)
                    if n * dtype.itemsize > info.file_size or n > MAX_TENSOR_ELEMENTS:
                        raise BundleError(f"{what} {p}: array {k!r} claims shape {tuple(shape)}, more than its "
                                          f"{info.file_size} bytes hold")
                with zf.open(info) as f:
                    out[k] = fmt.read_array(f, allow_pickle=False)
    except BundleError:
        raise
    except (OSError, ValueError, EOFError, AttributeError, KeyError, zipfile.BadZipFile, RuntimeError) as e:
        raise BundleError(f"cannot read {what} {p}: not a usable .npz ({str(e).splitlines()[0] if str(e) else e!r})"
                          ) from None
    return out


def check_save_target(path: str) -> Path:
    """``--save-outputs``: a new or regular file in an existing folder, never a folder, symlink or device."""
    if not path or "\0" in path:
        raise BundleError(f"--save-outputs {path!r} is not a usable file name")
    p = Path(path)
    if p.is_symlink():
        raise BundleError(f"--save-outputs {p} is a symlink; the runner does not write through one")
    if p.exists():
        regular_file(p, "--save-outputs")
    if not p.parent.is_dir():
        raise BundleError(f"--save-outputs {p}: folder {p.parent} does not exist")
    return p


def save_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` atomically (temp file in the same folder, then rename)."""
    import tempfile

    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise BundleError(f"cannot write --save-outputs {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]
        check_save_target(str(path))  # again: not replaced if it became a symlink or a device meanwhile
        os.replace(tmp, path)
    except OSError as e:
        raise BundleError(f"cannot write --save-outputs {path}: {e.strerror or e}") from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="runner.py", description="Run an rkpart bundle and gate it against reference outputs.")
    ap.add_argument("--bundle", default=str(Path(__file__).resolve().parent),
                    help="bundle folder [default: the folder of this file]")
    ap.add_argument("--inputs", default=None, help=".npz of model inputs [default: the bundle's ref_inputs.npz]")
    ap.add_argument("--reference", default=None,
                    help=".npz of reference outputs to gate against [default: the bundle's ref_outputs.npz "
                         "when --inputs is not given]")
    ap.add_argument("--residency", choices=RESIDENCIES, default=None, help="override the manifest's residency")
    ap.add_argument("--core-mask", choices=tuple(CORE_MASKS), default=None, help="override the manifest's core mask")
    ap.add_argument("--passes", type=int, default=1, help="passes to run (timings of each are printed)")
    ap.add_argument("--min-cosine", type=float, default=None, help="gate [default: the manifest's]")
    ap.add_argument("--max-abs-rel", type=float, default=None, help="gate [default: the manifest's]")
    ap.add_argument("--save-outputs", default=None, help="write the outputs of the last pass to this .npz")
    ap.add_argument("--no-verify", action="store_true", help="skip the sha256 check of the bundle's files")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    try:
        return _main(args)
    except BundleError as e:
        print(f"runner: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


def _main(args: argparse.Namespace) -> int:
    if args.passes < 1:
        raise BundleError("--passes must be at least 1")
    for flag, v in (("--min-cosine", args.min_cosine), ("--max-abs-rel", args.max_abs_rel)):
        if v is not None and not (v == v and abs(v) != float("inf")):
            raise BundleError(f"{flag} must be a finite number, got {v}")
    save_to = check_save_target(args.save_outputs) if args.save_outputs is not None else None
    folder = Path(args.bundle)
    m = read_manifest(folder)
    ref_files = m.get("reference") or {}
    inputs_path = args.inputs or (folder / ref_files["inputs"] if ref_files.get("inputs") else None)
    if inputs_path is None:
        raise BundleError("this bundle has no reference inputs; pass --inputs FILE.npz")
    reference = args.reference
    if reference is None and args.inputs is None and ref_files.get("outputs"):
        reference = folder / ref_files["outputs"]
    runner = Runner(folder, residency=args.residency, core_mask=args.core_mask, verify=not args.no_verify)
    if runner.npu_standin is not None:
        print(f"runner: NPU stages run on an ONNX Runtime stand-in ({STANDIN_ENV}={runner.npu_standin}), "
              "not on the NPU", file=sys.stderr)
    feeds = load_npz(inputs_path, "inputs", names=runner.inputs)
    passes: list[dict[str, float]] = []

    def summed(timings: list[tuple[str, str, float]], wall: float) -> dict[str, float]:
        phases = {p: 0.0 for p in ("load", "init", "infer", "release")}
        for _sid, p, t in timings:
            phases[p] += t
        return {"wall_s": wall, **{f"{p}_s": t for p, t in phases.items()}}

    t0 = time.perf_counter()
    with runner:
        opened = time.perf_counter() - t0
        for _ in range(args.passes):
            t0 = time.perf_counter()
            outs = runner.run(feeds)
            passes.append(summed(runner.timings, time.perf_counter() - t0))
        t0 = time.perf_counter()
    closed = time.perf_counter() - t0
    setup = summed(runner.open_timings + runner.close_timings, opened + closed)
    if save_to is not None:
        save_npz(save_to, outs)
    gate = dict(m.get("gate") or {})
    min_cos = args.min_cosine if args.min_cosine is not None else gate.get("min_cosine")
    max_rel = args.max_abs_rel if args.max_abs_rel is not None else gate.get("max_abs_rel", DEFAULT_MAX_ABS_REL)
    results: dict[str, dict[str, float]] = {}
    failures: list[str] = []
    if reference is not None:
        ref = load_npz(reference, "reference", names=runner.outputs)
        for n in runner.outputs:
            if n not in ref:
                raise BundleError(f"reference {reference} has no array {n!r}")
            r = results[n] = compare(outs[n], ref[n])
            if r["nonfinite"]:
                failures.append(f"{n}: {r['nonfinite']} NaN/Inf values")
            if min_cos is not None and not r["cosine"] >= min_cos:
                failures.append(f"{n}: cosine {r['cosine']:.8f} < {min_cos}")
            if max_rel is not None and not r["max_abs_rel"] <= max_rel:
                failures.append(f"{n}: max abs error / max |reference| {r['max_abs_rel']:.3g} > {max_rel}")
    report = {"bundle": str(folder), "residency": sorted(set(runner.residency.values())),
              "core_mask": runner.core_mask, "npu_standin": str(runner.npu_standin) if runner.npu_standin else None,
              "open_close": setup, "passes": passes, "outputs": results,
              "gate": {"min_cosine": min_cos, "max_abs_rel": max_rel},
              "passed": not failures, "failures": failures}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for label, p in [("open+close", setup), *((f"pass {i}", p) for i, p in enumerate(passes))]:
            print(f"{label}: {p['wall_s']:.3f} s (load {p['load_s']:.3f}, init {p['init_s']:.3f}, "
                  f"infer {p['infer_s']:.3f}, release {p['release_s']:.3f})")
        for n, r in results.items():
            print(f"{n}: cosine {r['cosine']:.8f}  max abs {r['max_abs']:.3g}  max abs rel {r['max_abs_rel']:.3g}")
        if reference is None:
            print("gate: not run (no --reference)")
        else:
            print("gate: PASS" if not failures else "gate: FAIL (" + "; ".join(failures) + ")")
    return EXIT_GATE if failures else 0


if __name__ == "__main__":
    sys.exit(main())
