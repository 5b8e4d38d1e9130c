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

A whole denoising loop (``rkpart drift``'s sampler: seeded latent, CFG, flow-matching Euler;
the manifest's ``denoise`` record names the latent, timestep and conditioning inputs)::

    python runner.py --steps 30 --guidance 4.5 --cond prompt.npz --latent-out latent.npy [--cfg-parallel]
    x = Runner("bundle/").denoise(30, guidance=4.5, cond={"encoder_hidden_states": ctx})

``cfg_parallel`` (``--cfg-parallel``) runs the two passes of each step at the same time, each
in its own thread on its own context of every NPU stage (core masks 0 and 1): twice the
device memory, the same bytes out.  Otherwise every NPU stage has its own core mask
(``manifest.json``, set by ``rkpart bundle --core-mask``; ``--core-mask`` overrides all).

Residency (``manifest.json`` ``residency`` per stage, ``--residency`` overrides all):
``per-stage`` stages are loaded, initialised, run and released around every use (one NPU
context alive at a time, the policy for boards with little memory); ``resident`` stages
are loaded and initialised once, when the runner opens, and released by :meth:`Runner.close`.
Host stages always stay resident (ONNX Runtime sessions on the CPU).

ONNX Runtime stand-in: with ``RKPART_RUNNER_NPU_STANDIN=DIR`` in the environment (or
``npu_standin=DIR``), NPU stages run on ONNX Runtime from the stage ``.onnx`` files found
under ``DIR`` at each stage's ``source`` path (the plan folder the bundle was made from).
That is for checking a bundle on a machine without an NPU; it is never the NPU.

Exit codes of the command line: 0 gate passed (or the loop ran), 2 bad input (one-line
message; also a bundle without a loop record, or a run over the manifest's device budget),
7 the NPU runtime failed, 8 the numerical gate failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn

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

#: the denoising loop's schedulers (``rkpart drift``'s: flow-matching Euler, with shift)
SCHEDULERS = ("flow-euler",)
#: the range of each number a gate or the loop reads, from the manifest or as an option: beyond
#: them a gate passes everything (``min_cosine`` -1e300, ``max_abs_rel`` 1e300) or nothing, and a
#: loop overflows (a shift of 1e-320 divides by zero, a timestep scale of 1e300 is inf in float32)
NUMBER_RANGES: dict[str, tuple[float, float]] = {
    "min_cosine": (-1.0, 1.0), "max_abs_rel": (0.0, 1000.0), "guidance": (-1000.0, 1000.0),
    "shift": (1e-3, 1e3), "timestep_scale": (1e-3, 1e6), "timestep_offset": (-1e6, 1e6),
    "guidance_input_scale": (-1e6, 1e6),
}
#: how the loop's record says the pipeline guides (``rkpart.description`` ``cfg.mode``): a
#: conditional and an unconditional call, one call on the [uncond, cond] pair, the guidance fed
#: as an input, or none
CFG_MODES = ("two-pass", "batched", "distilled", "none")


#: numbers whose range is that of their magnitude: a reversed timestep (Z-Image: ``1 - t / 1000``)
#: has a negative scale, a zero one none
SIGNED = frozenset({"timestep_scale"})


def check_number(v: Any, key: str, what: str) -> float:
    """``v`` as a float if it is a finite number within ``NUMBER_RANGES[key]`` (its magnitude for
    :data:`SIGNED` keys), else :class:`BundleError`."""
    lo, hi = NUMBER_RANGES[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= (
            abs(v) if key in SIGNED else v) <= hi:
        where = f"[{lo:g}, {hi:g}]" if key not in SIGNED else f"[{lo:g}, {hi:g}] or [{-hi:g}, {-lo:g}]"
        raise BundleError(f"{what} must be a finite number in {where}, got {repr(v)[:40]}")
    return float(v)
#: core masks of the two passes' contexts under ``--cfg-parallel``
CFG_LANE_MASKS = ("0", "1")
#: the flags of ``rkpart bundle`` that name the loop's inputs (rkpart.roles.ROLE_FLAGS)
LOOP_FLAGS = "--latent-input NAME --timestep-input NAME [--guidance-input NAME] [--context-input NAME ...]"


def input_digest(a: Any) -> str:
    """sha256 of an array's dtype, shape and bytes: :func:`rkpart.io.input_digest`, which this
    leaf module cannot import (a test keeps the two equal)."""
    arr = np.ascontiguousarray(a)
    h = hashlib.sha256(f"{arr.dtype.str}{list(arr.shape)}".encode())
    h.update(arr.tobytes())
    return h.hexdigest()


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


#: precisions whose build turned the stage's inputs and outputs into int8 (issue 27)
QUANTIZED = ("int8", "hybrid")


def npu_inputs(arrays: Sequence[np.ndarray], precision: str) -> list[np.ndarray]:
    """What to pass to ``inference`` for a stage built at ``precision`` (the manifest's stage entry).

    An int8 (w8a8) or hybrid build has int8 inputs; RKNNLite's ``inference`` (``inputs_pass_through``
    off, its default) quantizes float inputs with the model's scale and zero point, a conversion
    defined from float32: float inputs of such a stage go as float32, not as the fp16 arrays an fp16
    plan passes between stages.  Its outputs come back float32 (``Runner._conform`` casts them)."""
    if precision not in QUANTIZED:
        return [np.ascontiguousarray(a) for a in arrays]
    return [np.ascontiguousarray(a, dtype=np.float32) if a.dtype.kind == "f" else np.ascontiguousarray(a)
            for a in arrays]


class RknnLiteSession:
    """A compiled ``.rknn`` stage on the NPU: each lifecycle method is one RKNNLite call."""

    def __init__(self, path: Path, core_mask: int, api: Any = None, name: str = "", precision: str = "fp16") -> None:
        self.path, self.core_mask, self.name = path, core_mask, name or path.name
        self.precision = precision
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
        arrays = npu_inputs(arrays, self.precision)
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
    m = load_json(path, "manifest", symlinks=False)  # a symlinked manifest is refused as any other symlink
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


def regular_file(path: Path, what: str, *, symlinks: bool = True) -> os.stat_result:
    """``os.stat`` of ``path`` if it is a regular file (a FIFO would block, /dev/zero never ends);
    ``symlinks=False``: not a symlink either (a bundle's own files: rkpart bundle writes none).

    The runner's half of rkpart's one reader (rkpart.readers, issue 51): the same rules, here
    because the runner cannot import rkpart."""
    import stat as _stat

    try:
        lst = os.lstat(path)
        st = os.stat(path) if _stat.S_ISLNK(lst.st_mode) else lst
    except FileNotFoundError:
        raise BundleError(f"{what} {path} does not exist") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise BundleError(f"cannot read {what} {path!r}: {e}") from None
    if _stat.S_ISLNK(lst.st_mode) and not symlinks:
        raise BundleError(f"{what} {path} is a symlink; the runner reads only the bundle's own regular files")
    if not _stat.S_ISREG(st.st_mode):
        raise BundleError(f"{what} {path} is not a regular file")
    return st


def open_regular(path: Path, what: str, *, symlinks: bool = True, max_bytes: int | None = None) -> Any:
    """``path`` opened for reading after :func:`regular_file`: non-blocking (a path swapped for a FIFO
    after the check cannot hang the open), ``O_NOFOLLOW`` when ``symlinks`` is off, checked again
    through the descriptor, and within ``max_bytes``."""
    import stat as _stat

    regular_file(path, what, symlinks=symlinks)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if symlinks else os.O_NOFOLLOW))
    except OSError as e:
        raise BundleError(f"cannot read {what} {path}: {e.strerror or e}") from None
    f = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    if not _stat.S_ISREG(st.st_mode) or (max_bytes is not None and st.st_size > max_bytes):
        f.close()
        raise BundleError(f"{what} {path} is not a regular file" if not _stat.S_ISREG(st.st_mode) else
                          f"{what} {path} is too large ({st.st_size} bytes; the limit is {max_bytes})")
    return f


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


def load_json(path: Path, what: str, max_bytes: int = MAX_MANIFEST_BYTES, *, symlinks: bool = True) -> Any:
    """A JSON file, whole and bounded: regular file (:func:`open_regular`), size, integer digits,
    nesting depth."""
    try:
        with open_regular(path, what, symlinks=symlinks, max_bytes=max_bytes) as f:
            raw = f.read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise BundleError(f"{what} {path} is too large (over {max_bytes} bytes)")
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
        if s.get("precision", "fp16") not in ("fp16", *QUANTIZED):
            raise BundleError(f"manifest: stage {sid}: precision {repr(s.get('precision'))[:40]} is not one of "
                              f"fp16, {', '.join(QUANTIZED)}")
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
        if gate.get(k) is not None:
            check_number(gate[k], k, f"manifest: gate.{k}")
    _validate_loop(m.get("denoise"), tensors, {t["name"] for t in m["inputs"]}, {t["name"] for t in m["outputs"]})
    fixed = m["denoise"].get("fixed") if isinstance(m.get("denoise"), dict) else None
    if isinstance(fixed, dict) and fixed.get("file") not in files:
        raise BundleError(f"manifest: denoise.fixed file {fixed.get('file')!r} is not listed in 'files'")
    ref = _obj(m.get("reference") or {}, "'reference'")
    for k in ("inputs", "outputs"):
        if ref.get(k) is not None:
            rel = _relpath(_name(ref[k], f"reference.{k}"), "reference")
            if rel not in files:
                raise BundleError(f"manifest: reference {k} {rel!r} is not listed in 'files'")
    if "core_mask" in m and m["core_mask"] not in CORE_MASKS:
        raise BundleError(f"manifest: core_mask {repr(m['core_mask'])[:40]} is not one of {', '.join(CORE_MASKS)}")


def _validate_loop(d: Any, tensors: Mapping[str, Any], inputs: set[str] | None = None,
                   outputs: set[str] | None = None) -> None:
    """The manifest's ``denoise`` record, when it describes a loop (not absent, not an ``error``):
    tensor names the manifest lists and every number in its range (:data:`NUMBER_RANGES`)."""
    if not isinstance(d, dict) or "error" in d or not all(k in d for k in ("latent", "timestep", "context")):
        return  # Runner.loop refuses it, naming rkpart bundle's flags, when a loop is asked for
    for k in ("latent", "timestep", *(("output",) if d.get("output") is not None else ())):
        if _name(d[k], f"denoise.{k}") not in tensors:
            raise BundleError(f"manifest: denoise.{k} {d[k]!r} has no entry in 'tensors'")
    for t in _list(d["context"], "denoise.context"):
        if _name(t, "a denoise.context name") not in tensors:
            raise BundleError(f"manifest: denoise.context {t!r} has no entry in 'tensors'")
    # the loop feeds the latent, the timestep and the context as model inputs, each once, and reads
    # the model output it names (a model input there failed with a KeyError, exit 1)
    inputs, outputs = inputs or set(), outputs or set()
    fed = [d["latent"], d["timestep"], *d["context"]]
    for t in fed:
        if t not in inputs:
            raise BundleError(f"manifest: denoise names {t!r} as a loop input, but it is no model input")
    if len(set(fed)) != len(fed):
        raise BundleError("manifest: denoise names one model input twice (latent, timestep and context are distinct)")
    if d.get("output") is not None and d["output"] not in outputs:
        raise BundleError(f"manifest: denoise.output {d['output']!r} is no model output")
    if "cfg_parallel" in d and not isinstance(d["cfg_parallel"], bool):
        raise BundleError(f"manifest: denoise.cfg_parallel must be true or false, got {repr(d['cfg_parallel'])[:40]}")
    if "guidance" in d:
        check_number(d["guidance"], "guidance", "manifest: denoise.guidance")
    if d.get("guidance_input") is not None and _name(d["guidance_input"], "denoise.guidance_input") not in tensors:
        raise BundleError(f"manifest: denoise.guidance_input {d['guidance_input']!r} has no entry in 'tensors'")
    if "guidance_input_scale" in d:
        check_number(d["guidance_input_scale"], "guidance_input_scale", "manifest: denoise.guidance_input_scale")
    if d.get("cfg_mode", "two-pass") not in CFG_MODES:
        raise BundleError(f"manifest: denoise.cfg_mode {repr(d.get('cfg_mode'))[:40]} is not one of "
                          f"{', '.join(CFG_MODES)}")
    if d.get("output_sign", 1) not in (1, -1, 1.0, -1.0) or not isinstance(d.get("learned_sigma", False), bool):
        raise BundleError("manifest: denoise.output_sign must be 1 or -1 and denoise.learned_sigma a boolean")
    fixed = d.get("fixed")
    if fixed is not None:
        fixed = _obj(fixed, "denoise.fixed")
        _relpath(_name(fixed.get("file"), "denoise.fixed.file"), "denoise.fixed.file")
        for t in _list(fixed.get("inputs"), "denoise.fixed.inputs"):
            if _name(t, "a denoise.fixed input") not in tensors:
                raise BundleError(f"manifest: denoise.fixed input {t!r} has no entry in 'tensors'")
    sched = {} if d.get("scheduler") is None else _obj(d["scheduler"], "denoise.scheduler")
    if "name" in sched and sched["name"] not in SCHEDULERS:
        raise BundleError(f"manifest: denoise.scheduler.name {repr(sched['name'])[:40]} is not one of "
                          f"{', '.join(SCHEDULERS)}")
    for k in ("shift", "timestep_scale", "timestep_offset"):
        if k in sched:
            check_number(sched[k], k, f"manifest: denoise.scheduler.{k}")


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
        regular_file(p, "bundle file", symlinks=False)
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
                 verify: bool = True, rknnlite_api: Any = None, cfg_parallel: bool = False) -> None:
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
        #: two contexts of every NPU stage, one per CFG pass, on NPU cores 0 and 1 (:meth:`run_passes`)
        self.cfg_parallel = bool(cfg_parallel)
        self._open_lane1: dict[str, Any] = {}  # the second pass's resident sessions under cfg_parallel
        self._core_mask_override = core_mask
        self._host_lock = threading.Lock()
        for s in self.stages:
            mask = self.stage_core_mask(s)
            if mask not in CORE_MASKS:
                raise BundleError(f"stage {s['id']}: core mask {mask!r} is not one of {', '.join(CORE_MASKS)}")
        #: per denoising step of the last :meth:`denoise`: wall seconds and the lifecycle split
        self.step_timings: list[dict[str, float]] = []
        self._opened = False
        #: seconds per (stage id, phase) of the last :meth:`run`, phases load/init/infer/release
        self.timings: list[tuple[str, str, float]] = []
        #: the same for :meth:`open` (resident stages' load/init) and :meth:`close` (their release)
        self.open_timings: list[tuple[str, str, float]] = []
        self.close_timings: list[tuple[str, str, float]] = []
        self._sink = self.timings

    # -- sessions ---------------------------------------------------------------------------
    def stage_core_mask(self, s: Mapping[str, Any], lane: int = 0) -> str:
        """The core mask a stage's context is initialised with: under ``cfg_parallel`` core 0 for
        the first pass and core 1 for the second; else ``--core-mask``, the stage's, the manifest's."""
        if self.cfg_parallel:
            return CFG_LANE_MASKS[lane]
        return self._core_mask_override or str(s.get("core_mask") or self.core_mask)

    def _session(self, s: Mapping[str, Any], lane: int = 0) -> Any:
        ins, outs = tuple(s["inputs"]), tuple(s["outputs"])
        if s["device"] != "npu":
            return OrtSession(inside(self.folder, s["file"]), ins, outs)
        if self.npu_standin is not None:
            return OrtSession(standin_file(self.npu_standin, s["source"], s.get("source_sha256")), ins, outs)
        if self._api is None:
            self._api = import_rknnlite()
        return RknnLiteSession(inside(self.folder, s["file"]), CORE_MASKS[self.stage_core_mask(s, lane)], self._api,
                               s["id"], str(s.get("precision", "fp16")))

    def _timed(self, sid: str, phase: str, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args)
        self._sink.append((sid, phase, time.perf_counter() - t0))
        return out

    def _start(self, s: Mapping[str, Any], lane: int = 0) -> Any:
        sess = self._session(s, lane)
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
                    if self.cfg_parallel:
                        self._open_lane1[s["id"]] = self._start(s, 1)
        return self

    def close(self) -> None:
        """Release every resident session."""
        self.close_timings = self._sink = []
        for sid, sess in [*self._open.items(), *self._open_lane1.items()]:
            self._timed(sid, "release", sess.release)
        self._open.clear()
        self._open_lane1.clear()
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
        # a plan specialised to data-dependent shapes (rkpart partition --inputs) runs only on
        # the model inputs those shapes came from (docs/plan.md, "specialised")
        for rec in self.manifest.get("specialised", ()):
            for n, digest in sorted(rec["inputs"].items()):
                if n in feeds and input_digest(feeds[n]) != digest:
                    raise BundleError(f"input {n!r} differs from the one this plan was specialised to ({rec['op']} "
                                      f"node {rec['node']!r} gave {rec['tensor']!r} the shape {rec['shape']}); "
                                      "partition again with --inputs holding these inputs")
        return feeds

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """One pass through every stage in order; returns the model outputs by name."""
        self.open()
        self.timings = self._sink = []
        env = self.check_inputs(inputs)
        for k, s in enumerate(self.stages):
            self._stage_passes(s, [env])
            for name in self._drop[k]:
                env.pop(name, None)
        return {n: env[n] for n in self.outputs}

    def _call_stage(self, s: Mapping[str, Any], sess: Any, env: dict[str, np.ndarray]) -> None:
        """One stage on one pass: its inputs from ``env``, its outputs (as the plan recorded them) into it.

        Every pass of every mode (:meth:`run`, :meth:`run_passes`, CFG in parallel) calls a
        stage through here, so conversions of stage I/O belong here and nowhere else.
        """
        outs = self._timed(s["id"], "infer", sess.infer, [env[n] for n in s["inputs"]])
        if len(outs) != len(s["outputs"]):
            raise RuntimeFailure(f"stage {s['id']}: {len(outs)} outputs, expected {len(s['outputs'])}")
        for name, a in zip(s["outputs"], outs, strict=True):
            env[name] = self._conform(name, np.asarray(a))

    def _conform(self, name: str, a: np.ndarray) -> np.ndarray:
        """The runtime's output in the dtype and shape the plan recorded (RKNN returns float32, flat shapes)."""
        info = self.tensors.get(name)
        if info is None:
            return a
        shape, dtype = tuple(info["shape"]), np.dtype(info["dtype"])
        if a.shape != shape and a.size == int(np.prod(shape, dtype=np.int64)):
            a = a.reshape(shape)
        return a.astype(dtype, copy=False)


    # -- several passes at once, and the denoising loop --------------------------------------
    def run_passes(self, passes: Sequence[Mapping[str, Any]]) -> list[dict[str, np.ndarray]]:
        """Independent passes (CFG's conditional and unconditional one) through every stage, stage-major.

        Sequentially (the default), each stage serves every pass back to back, so a
        ``per-stage`` stage is loaded, initialised and released once for all of them: one NPU
        context alive at a time.  With ``cfg_parallel`` (two passes) the two passes of a stage
        run at the same time in two threads, each on its own context of the stage (core mask 0
        and 1): two NPU contexts alive at once, doubling the device memory a stage holds.  The
        results equal :meth:`run` on each pass either way.
        """
        if self.cfg_parallel and len(passes) != 2:
            raise BundleError(f"cfg_parallel runs two passes (cond and uncond) at once, not {len(passes)}")
        self.open()
        self.timings = self._sink = []
        envs = [self.check_inputs(p) for p in passes]
        # one thread per pass, so a pass's contexts always live in the same thread
        lanes = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"cfg-{name}")
                 for name in ("cond", "uncond")] if self.cfg_parallel else []
        try:
            for k, s in enumerate(self.stages):
                if not lanes:
                    self._stage_passes(s, envs)
                else:
                    ready = threading.Barrier(2)
                    futures = [pool.submit(self._stage_lane, s, lane, envs[lane], ready)
                               for lane, pool in enumerate(lanes)]
                    errors = [f.exception() for f in futures]  # waits for both: both contexts are released
                    real = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
                    first = next(iter(real or [e for e in errors if e is not None]), None)
                    if first is not None:
                        raise first
                for env in envs:
                    for name in self._drop[k]:
                        env.pop(name, None)
        finally:
            for pool in lanes:
                pool.shutdown(wait=True)
        return [{n: env[n] for n in self.outputs} for env in envs]

    def _stage_passes(self, s: Mapping[str, Any], envs: list[dict[str, np.ndarray]]) -> None:
        sid = s["id"]
        resident = self.residency[sid] == "resident"
        sess = self._open.get(sid)
        if sess is None:
            sess = self._start(s)
            if resident:
                self._open[sid] = sess
        try:
            for env in envs:
                self._call_stage(s, sess, env)
        finally:
            if not resident:
                self._timed(sid, "release", sess.release)

    def _stage_lane(self, s: Mapping[str, Any], lane: int, env: dict[str, np.ndarray],
                    ready: threading.Barrier) -> None:
        """One pass of a stage in its lane's thread, on the lane's own NPU context (host stages share one session).

        Both lanes initialise their context before either infers (``ready``): the two passes
        then run on the two cores at the same time, rather than one after the other by chance.
        """
        sid = s["id"]
        if s["device"] != "npu":
            with self._host_lock:  # the first use starts the session; ORT runs one session in two threads
                sess = self._open.get(sid)
                if sess is None:
                    sess = self._open[sid] = self._start(s)
            self._call_stage(s, sess, env)
            return
        held = self._open if lane == 0 else self._open_lane1
        resident = self.residency[sid] == "resident"
        sess = held.get(sid)
        if sess is None:
            try:
                sess = self._start(s, lane)
            except BaseException:
                ready.abort()  # the other lane must not wait for this one
                raise
            if resident:
                held[sid] = sess
        try:
            ready.wait()
            self._call_stage(s, sess, env)
        finally:
            if not resident:
                self._timed(sid, "release", sess.release)

    @property
    def loop(self) -> dict[str, Any]:
        """The manifest's ``denoise`` record: which inputs are latent, timestep and conditioning.

        Raises :class:`BundleError` (one line, naming ``rkpart bundle``'s flags) when the bundle
        does not say.
        """
        d = self.manifest.get("denoise")
        if not isinstance(d, dict) or "error" in d or not all(k in d for k in ("latent", "timestep", "context")):
            why = d.get("error") if isinstance(d, dict) and d.get("error") else "the manifest has no denoise record"
            raise BundleError(f"this bundle cannot run a denoising loop: {why}; name the inputs with "
                              f"`rkpart bundle {LOOP_FLAGS}`")
        return d

    def denoise(self, steps: int, *, guidance: float | None = None, seed: int = 0, shift: float | None = None,
                scheduler: str = "flow-euler", cond: Mapping[str, Any] | None = None,
                uncond: Mapping[str, Any] | None = None, cfg: bool = True,
                on_step: Callable[[int, dict[str, float]], None] | None = None) -> np.ndarray:
        """A whole denoising loop; returns the final latent.

        ``rkpart drift``'s sampler, as the manifest's ``denoise`` record gives it: the initial
        latent and the conditioning from ``numpy.random.default_rng(seed)`` (the latent first,
        then each conditioning input in the record's order, standard normal; one row of each
        under ``cfg_mode`` ``batched``); the unconditional pass gets zeros unless ``uncond`` is
        given; the record's fixed inputs (masks, id grids, RoPE tables) their values from its
        ``fixed`` file.  Every step a conditional and an unconditional pass (``cfg``, ``cfg_mode``
        ``two-pass``), one call on the ``[uncond, cond]`` pair (``batched``) or one call with the
        guidance fed to the record's ``guidance_input`` (``distilled``);
        ``v = v_u + guidance * (v_c - v_u)``, and a flow-matching Euler step from sigma 1 to 0
        (:func:`flow_sigmas` with ``shift``) with timestep ``sigma * timestep_scale +
        timestep_offset``.  ``cond`` replaces the drawn conditioning (the latent is drawn all the
        same).  ``on_step(step, timing)`` follows every step; :attr:`step_timings` keeps them.
        """
        d = self.loop
        if scheduler not in SCHEDULERS:
            raise BundleError(f"scheduler {scheduler!r} is not one of {', '.join(SCHEDULERS)}")
        if steps < 1:
            raise BundleError("steps must be at least 1")
        mode = str(d.get("cfg_mode", "two-pass"))
        if self.cfg_parallel and (not cfg or mode != "two-pass"):
            raise BundleError("--cfg-parallel runs the two CFG passes at once; it cannot go with --no-cfg"
                              if mode == "two-pass" else
                              f"--cfg-parallel runs two CFG passes at once; this pipeline's guidance is {mode} "
                              "(one call per step)")
        sched = dict(d.get("scheduler") or {})
        shift = check_number(sched.get("shift", 1.0) if shift is None else shift, "shift", "shift")
        guidance = check_number(d.get("guidance", 4.0) if guidance is None else guidance, "guidance", "guidance")
        scale = check_number(sched.get("timestep_scale", 1000.0), "timestep_scale", "timestep_scale")
        offset = check_number(sched.get("timestep_offset", 0.0), "timestep_offset", "timestep_offset")
        gscale = check_number(d.get("guidance_input_scale", 1.0), "guidance_input_scale", "guidance_input_scale")
        sign = float(d.get("output_sign", 1))
        learned, axis = bool(d.get("learned_sigma", False)), int(d.get("channels_axis", 1))
        if steps > MAX_COUNT:
            raise BundleError(f"steps must be at most {MAX_COUNT}, got {steps}")
        lat_name, ts_name, out_name = d["latent"], d["timestep"], d.get("output") or self.outputs[0]
        g_name = d.get("guidance_input")
        context = list(d["context"])
        batched = mode == "batched"

        def shape_of(name: str) -> tuple[int, ...]:
            shape = tuple(self.tensors[name]["shape"])
            return (shape[0] // 2, *shape[1:]) if batched else shape

        lat, ts = self.tensors[lat_name], self.tensors[ts_name]
        rng = np.random.default_rng(seed)
        x = rng.standard_normal(shape_of(lat_name)).astype(np.dtype(lat["dtype"]))
        drawn = {t: rng.standard_normal(shape_of(t)).astype(np.dtype(self.tensors[t]["dtype"])) for t in context}
        c = self._conditioning(cond, "cond", shape_of) if cond is not None else drawn
        u = self._conditioning(uncond, "uncond", shape_of) if uncond is not None else \
            {t: np.zeros_like(v) for t, v in c.items()}
        fixed = self.loop_fixed()

        def model_output(a: np.ndarray) -> np.ndarray:
            a = np.asarray(a, dtype=np.float32)
            if learned:
                a = np.split(a, 2, axis=axis)[0]
            return a * np.float32(sign) if sign != 1 else a

        sigmas = flow_sigmas(steps, shift)
        self.step_timings = []
        self.open()
        for i in range(steps):
            t0 = time.perf_counter()
            t = np.full(tuple(ts["shape"]), sigmas[i] * scale + offset, dtype=np.dtype(ts["dtype"]))
            common = {**fixed, ts_name: t}
            if g_name is not None:
                gi = self.tensors[g_name]
                common[g_name] = np.full(tuple(gi["shape"]), guidance * gscale, dtype=np.dtype(gi["dtype"]))
            if batched:
                feeds = [{**common, lat_name: np.concatenate([x, x]),
                          **{n: np.concatenate([u[n], c[n]]) for n in c}}]
            else:
                feeds = [{**common, lat_name: x, **c}] + (
                    [{**common, lat_name: x, **u}] if cfg and mode == "two-pass" else [])
            outs = self.run_passes(feeds)
            # the same expressions as rkpart drift (float32 CFG combine, Euler step in the latent's dtype)
            # an overflow is no warning on stderr: a NaN/Inf latent is refused at the end (exit 8)
            with np.errstate(over="ignore", invalid="ignore"):
                if batched:
                    vu, v = np.split(model_output(outs[0][out_name]), 2)
                    if cfg:
                        v = vu + guidance * (v - vu)
                else:
                    v = model_output(outs[0][out_name])
                    if len(outs) > 1:
                        vu = model_output(outs[1][out_name])
                        v = vu + guidance * (v - vu)
                x = (x.astype(np.float32) + (sigmas[i + 1] - sigmas[i]) * v).astype(x.dtype)
            timing = summed(self.timings, time.perf_counter() - t0)
            self.step_timings.append(timing)
            if on_step is not None:
                on_step(i, timing)
        return x

    def loop_fixed(self) -> dict[str, np.ndarray]:
        """The loop's fixed inputs (masks, id grids, RoPE tables, integer inputs) from the record's
        ``fixed`` file, each checked against its tensor's shape and dtype."""
        rec = self.loop.get("fixed")
        if not rec:
            return {}
        names = list(rec["inputs"])
        got = load_npz(inside(self.folder, rec["file"]), "loop inputs", names=names)
        for n in names:
            a, info = got.get(n), self.tensors[n]
            if a is None or tuple(a.shape) != tuple(info["shape"]) or str(a.dtype) != info["dtype"]:
                have = "missing" if a is None else f"{a.dtype} {tuple(a.shape)}"
                raise BundleError(f"loop inputs {rec['file']}: {n!r} is {have}, the model wants {info['dtype']} "
                                  f"{tuple(info['shape'])}")
        return got

    def _conditioning(self, arrays: Mapping[str, Any], what: str,
                      shape_of: Callable[[str], tuple[int, ...]] | None = None) -> dict[str, np.ndarray]:
        context = list(self.loop["context"])
        missing = [t for t in context if t not in arrays]
        if missing:
            raise BundleError(f"{what} conditioning lacks {missing[0]!r} (the loop's conditioning inputs: "
                              f"{', '.join(context) or 'none'})")
        out = {}
        for t in context:
            a, info = np.asarray(arrays[t]), self.tensors[t]
            shape = shape_of(t) if shape_of is not None else tuple(info["shape"])
            if tuple(a.shape) != shape or a.dtype.kind not in "biuf":
                raise BundleError(f"{what} conditioning {t!r}: {a.dtype} {tuple(a.shape)}, the model wants "
                                  f"{info['dtype']} {shape}")
            out[t] = a.astype(np.dtype(info["dtype"]), copy=False)
        return out


def flow_sigmas(steps: int, shift: float = 1.0) -> np.ndarray:
    """Flow-matching sigmas from 1 to 0 in ``steps`` equal steps, shifted as SD3 / Cosmos do:
    ``shift * s / (1 + (shift - 1) * s)`` (``shift`` 1: the equal steps of ``rkpart drift``)."""
    s = np.linspace(1.0, 0.0, steps + 1)
    if shift != 1.0:
        s = shift * s / (1.0 + (shift - 1.0) * s)
    return s


def summed(timings: Sequence[tuple[str, str, float]], wall: float) -> dict[str, float]:
    """Wall seconds and the seconds of each lifecycle phase (load/init/infer/release, summed over stages)."""
    phases = {p: 0.0 for p in ("load", "init", "infer", "release")}
    for _sid, p, t in timings:
        phases[p] += t
    return {"wall_s": wall, **{f"{p}_s": t for p, t in phases.items()}}


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
    fmt = np.lib.format
    out: dict[str, np.ndarray] = {}
    try:
        with open_regular(p, f"{what} file") as raw, zipfile.ZipFile(raw) as zf:
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


#: the zip comment of an ``.npz`` the runner (or ``rkpart run --save-outputs``) wrote: how ``--force``
#: knows a file for one of its own (rkpart.output.NPZ_COMMENT)
NPZ_COMMENT = b"rkpart outputs"


def _head(path: Path, n: int) -> bytes:
    """The first ``n`` bytes of the regular file ``path`` (``b""`` for anything else), non-blocking."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        import stat as _stat

        return f.read(n) if _stat.S_ISREG(os.fstat(fd).st_mode) else b""


def npz_written_here(path: Path) -> bool:
    """An ``.npz`` with the runner's zip comment (:data:`NPZ_COMMENT`)."""
    import zipfile

    if not _head(path, 4).startswith(b"PK"):
        return False
    try:
        with zipfile.ZipFile(path) as z:
            return z.comment == NPZ_COMMENT
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def npy_written_here(path: Path) -> bool:
    """A ``.npy`` array (the latent's format: NumPy's header, a numeric dtype)."""
    import io as _io

    head = _head(path, 1 << 16)
    if not head.startswith(b"\x93NUMPY"):
        return False
    try:
        f = _io.BytesIO(head)
        version = np.lib.format.read_magic(f)
        _shape, _fortran, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0(f))
    except (ValueError, EOFError, SyntaxError):
        return False
    return dtype.kind in "biuf" and not dtype.hasobject


#: every output flag of the runner and how it knows a file it wrote there (``--force`` replaces
#: only such a file); each goes through :func:`check_save_target`
OUTPUT_FLAGS: dict[str, Callable[[Path], bool]] = {"--save-outputs": npz_written_here, "--latent-out": npy_written_here}


def check_save_target(path: str, flag: str = "--save-outputs", *, force: bool = False, bundle: Path | None = None,
                      inputs: Sequence[str | os.PathLike[str] | None] = (),
                      owned: Callable[[Path], bool] | None = None) -> Path:
    """The rule of every output file of the runner (:data:`OUTPUT_FLAGS`; rkpart's ``-o FILE`` rule,
    issue 51): a new file in an existing folder, or with ``force`` one the runner wrote (``owned``,
    default the flag's test); never a folder, symlink, FIFO or device (``os.replace`` would put a
    regular file in place of ``/dev/null``), never one of the run's ``inputs``, never inside the
    ``bundle`` folder (its manifest and stage files are what the runner runs)."""
    if not path or "\0" in path:
        raise BundleError(f"{flag} {path!r} is not a usable file name")
    p = Path(path)
    real = Path(os.path.realpath(p))
    if bundle is not None:
        b = Path(os.path.realpath(bundle))
        if real == b or b in real.parents or Path(os.path.abspath(bundle)) in Path(os.path.abspath(p)).parents:
            raise BundleError(f"{flag} {p} lies inside the bundle {bundle}; the runner never writes over the bundle "
                              "it runs: choose a path outside it")
    for i in inputs:
        if i is not None and (Path(os.path.realpath(i)) == real or (
                p.exists() and Path(i).exists() and os.path.samefile(p, i))):
            raise BundleError(f"{flag} {p} is one of the run's inputs ({i}); choose another path")
    if p.is_symlink():
        raise BundleError(f"{flag} {p} is a symlink; the runner does not write through one")
    if p.exists():
        regular_file(p, flag)
        if not force:
            raise BundleError(f"{flag} {p} exists; pass --force to replace it")
        if not (owned or OUTPUT_FLAGS.get(flag, npy_written_here))(p):
            raise BundleError(f"refusing to replace {flag} {p}: the runner did not write it")
    if not p.parent.is_dir():
        raise BundleError(f"{flag} {p}: folder {p.parent} does not exist")
    return p


def save_atomic(path: Path, write: Callable[[Any], None], flag: str) -> None:
    """Write ``path`` atomically with ``write(file)``: a fresh temp file of its own in the same folder
    (``mkstemp``: never an existing name or a symlink planted there), then a rename, after the
    file-kind half of :func:`check_save_target` again (not replaced if it became a symlink or a
    device meanwhile)."""
    import tempfile

    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise BundleError(f"cannot write {flag} {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w+b") as f:
            write(f)
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise BundleError(f"{flag} {path} became a symlink or not a regular file while the runner wrote; "
                              "not replaced")
        os.replace(tmp, path)
    except OSError as e:
        raise BundleError(f"cannot write {flag} {path}: {e.strerror or e}") from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def save_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` atomically (:func:`save_atomic`), with the runner's zip comment."""
    import zipfile

    def write(f: Any) -> None:
        np.savez(f, **arrays)  # type: ignore[arg-type]
        f.flush()
        f.seek(0)
        with zipfile.ZipFile(f, "a") as z:
            z.comment = NPZ_COMMENT

    save_atomic(path, write, "--save-outputs")


#: the most ``--steps`` / ``--passes`` the runner accepts (rkpart's own bound, cli_args.MAX_COUNT)
MAX_COUNT = 10_000


def check_numbers(args: argparse.Namespace) -> None:
    """Every number option, before any work: counts in range, a seed NumPy takes, floats finite
    (a NaN ``--guidance`` made a NaN latent that exited 0)."""
    for flag, v in (("--steps", getattr(args, "steps", None)), ("--passes", getattr(args, "passes", None))):
        if v is not None and not 1 <= v <= MAX_COUNT:
            raise BundleError(f"{flag} must be in [1, {MAX_COUNT}], got {v}")
    seed = getattr(args, "seed", None)
    if seed is not None and not 0 <= seed < 2**32:
        raise BundleError(f"--seed must be in [0, 2**32), got {seed}")
    for flag in ("min_cosine", "max_abs_rel", "guidance", "shift"):
        v = getattr(args, flag, None)
        if v is not None:
            check_number(v, flag, f"--{flag.replace('_', '-')}")


#: the longest error message the runner prints (rkpart.errors.MAX_MESSAGE)
MAX_MESSAGE = 480


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` as one line of at most ``limit`` characters, the middle elided (rkpart.errors.one_line)."""
    msg = " ".join(str(text).split())
    if len(msg) <= limit:
        return msg
    tail = msg[-(limit // 5):]
    head = msg[: limit - len(tail) - 40]
    return f"{head} [... {len(msg) - len(head) - len(tail)} characters ...] {tail}"


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as the runner reports every error: one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"runner: error: {one_line(message)} (see '{self.prog} -h')", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(
        prog="runner.py", description="Run an rkpart bundle and gate it against reference outputs, or (--steps) "
                                      "run a whole denoising loop with classifier-free guidance.")
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
    ap.add_argument("--force", action="store_true", help="replace an output file (--save-outputs, --latent-out) "
                    "the runner wrote before")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    loop = ap.add_argument_group("denoising loop (rkpart drift's sampler; the manifest names the inputs)")
    loop.add_argument("--steps", type=int, default=None, help="run a denoising loop of this many steps "
                      "(instead of gating one pass)")
    loop.add_argument("--guidance", type=float, default=None, help="CFG scale [default: the manifest's, 4.0]")
    loop.add_argument("--no-cfg", action="store_true", help="conditional pass only (no CFG)")
    loop.add_argument("--scheduler", choices=SCHEDULERS, default="flow-euler",
                      help="flow-matching Euler, sigma 1 -> 0 [default: flow-euler]")
    loop.add_argument("--shift", type=float, default=None, help="sigma shift: shift*s/(1+(shift-1)*s) "
                      "[default: the manifest's, 1.0]")
    loop.add_argument("--seed", type=int, default=0, help="seed of the initial latent (and of the drawn "
                      "conditioning when --cond is not given) [default: 0]")
    loop.add_argument("--cond", default=None, help=".npz of the conditioning inputs [default: drawn from --seed]")
    loop.add_argument("--uncond", default=None, help=".npz of the unconditional pass's conditioning "
                      "[default: zeros]")
    loop.add_argument("--cfg-parallel", action="store_true", default=None,
                      help="run the cond and uncond pass of each step at once: two contexts of every NPU stage, "
                           "on NPU cores 0 and 1, in two threads (twice the device memory) [default: the manifest's]")
    loop.add_argument("--no-cfg-parallel", action="store_false", dest="cfg_parallel", help="one pass at a time")
    loop.add_argument("--latent-out", default="latent.npy", help="write the final latent here [default: latent.npy]")
    args = ap.parse_args(argv)
    try:
        if args.steps is not None:
            return _denoise_main(args)
        return _main(args)
    except BundleError as e:
        print(f"runner: error: {one_line(str(e))}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


def _main(args: argparse.Namespace) -> int:
    check_numbers(args)
    folder = Path(args.bundle)
    save_to = None if args.save_outputs is None else check_save_target(
        args.save_outputs, "--save-outputs", force=args.force, bundle=folder, inputs=(args.inputs, args.reference))
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



def _denoise_main(args: argparse.Namespace) -> int:
    check_numbers(args)
    folder = Path(args.bundle)
    out = check_save_target(args.latent_out, "--latent-out", force=args.force, bundle=folder,
                            inputs=(args.cond, args.uncond))
    m = read_manifest(folder)
    cfg_parallel = bool((m.get("denoise") or {}).get("cfg_parallel")) if args.cfg_parallel is None \
        else args.cfg_parallel
    runner = Runner(folder, residency=args.residency, core_mask=args.core_mask, verify=not args.no_verify,
                    cfg_parallel=cfg_parallel)
    runner.loop  # noqa: B018 - refuses a bundle without a denoise record before any work
    check_device_budget(runner)
    if runner.npu_standin is not None:
        print(f"runner: NPU stages run on an ONNX Runtime stand-in ({STANDIN_ENV}={runner.npu_standin}), "
              "not on the NPU", file=sys.stderr)
    cond = load_npz(args.cond, "cond") if args.cond else None
    uncond = load_npz(args.uncond, "uncond") if args.uncond else None
    cfg_mode = str(runner.loop.get("cfg_mode", "two-pass"))
    passes = 1 if args.no_cfg or cfg_mode != "two-pass" else 2
    mode = {"batched": "one call on the uncond/cond pair", "distilled": "one pass, distilled guidance",
            "none": "one pass"}.get(cfg_mode) or ("one pass" if args.no_cfg else (
                "cond and uncond in parallel (cores 0 and 1)" if cfg_parallel else "cond then uncond"))

    def on_step(i: int, t: dict[str, float]) -> None:
        if not args.json:
            print(f"step {i + 1}/{args.steps}: {t['wall_s']:.3f} s (load {t['load_s']:.3f}, init {t['init_s']:.3f}, "
                  f"infer {t['infer_s']:.3f}, release {t['release_s']:.3f}; {mode})", flush=True)

    t0 = time.perf_counter()
    with runner:
        opened = time.perf_counter() - t0
        x = runner.denoise(args.steps, guidance=args.guidance, seed=args.seed, shift=args.shift,
                           scheduler=args.scheduler, cond=cond, uncond=uncond, cfg=not args.no_cfg, on_step=on_step)
        t1 = time.perf_counter()
    setup = summed(runner.open_timings + runner.close_timings, opened + time.perf_counter() - t1)
    bad = int(np.count_nonzero(~np.isfinite(x))) if x.dtype.kind in "fc" else 0
    if bad:
        # never a pass: a NaN/Inf latent is not written and exits with the gate's code
        print(f"runner: error: the final latent holds {bad} NaN/Inf values of {x.size}; not written to {out}",
              file=sys.stderr)
        return EXIT_GATE
    save_atomic(out, lambda f: np.save(f, x, allow_pickle=False), "--latent-out")
    total = sum(t["wall_s"] for t in runner.step_timings) + setup["wall_s"]
    report = {"bundle": str(folder), "steps": args.steps, "passes_per_step": passes, "cfg_parallel": cfg_parallel,
              "seed": args.seed, "scheduler": args.scheduler, "latent": str(out), "latent_shape": list(x.shape),
              "latent_dtype": str(x.dtype), "open_close": setup, "per_step": runner.step_timings, "total_s": total,
              "npu_standin": str(runner.npu_standin) if runner.npu_standin else None,
              "core_masks": {s["id"]: runner.stage_core_mask(s) for s in runner.stages if s["device"] == "npu"}}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"open+close: {setup['wall_s']:.3f} s (load {setup['load_s']:.3f}, init {setup['init_s']:.3f}, "
              f"release {setup['release_s']:.3f})")
        print(f"latent: {out} {x.dtype} {tuple(x.shape)}; {args.steps} steps in {total:.3f} s")
    return 0


def device_need(runner: Runner) -> tuple[int, int] | None:
    """Device bytes the run holds at most (resident stages + the largest per-stage one; twice that
    under ``cfg_parallel``) and the manifest's budget; ``None`` when the manifest has no figures."""
    dm = runner.manifest.get("device_memory")
    if not isinstance(dm, dict) or "budget_bytes" not in dm:
        return None
    per = {s["id"]: int(s.get("device_bytes") or 0) for s in runner.stages if s["device"] == "npu"}
    resident = sum(b for sid, b in per.items() if runner.residency[sid] == "resident")
    peak = max((b for sid, b in per.items() if runner.residency[sid] != "resident"), default=0)
    return (resident + peak) * (2 if runner.cfg_parallel else 1), int(dm["budget_bytes"])


def check_device_budget(runner: Runner) -> None:
    """Refuse a run whose device memory (both contexts under ``cfg_parallel``) exceeds the bundle's budget."""
    got = device_need(runner)
    if got is not None and got[0] > got[1]:
        need, budget = got
        raise BundleError(f"this run holds {need / 2**20:.1f} MiB of device memory"
                          f"{' (two contexts per NPU stage: --cfg-parallel)' if runner.cfg_parallel else ''}, over "
                          f"the bundle's budget of {budget / 2**20:.1f} MiB; use --residency per-stage"
                          f"{' or --no-cfg-parallel' if runner.cfg_parallel else ''}")


if __name__ == "__main__":
    sys.exit(main())
