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
from typing import IO, TYPE_CHECKING, Any, NamedTuple, NoReturn

if TYPE_CHECKING:
    from rkpart.types import JsonMap, JsonObject

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

#: the denoising loop's samplers: the pipeline's own (``pipeline``: the scheduler class, config and
#: schedule rule of its ``pipeline.json``, stepped by the bundle's ``sampling.py``) and ``rkpart drift``'s
#: flow-matching Euler with shift (``flow-euler``, the only one of a bundle without a description)
SCHEDULERS = ("pipeline", "flow-euler")
#: the bundle's copy of ``rkpart.runtime.board_sampling``: diffusers' schedulers in NumPy
SAMPLING_FILE = "sampling.py"
#: a stand-in (``RKPART_RUNNER_NPU_STANDIN``) may name several plan folders (the model's, the VAE
#: decoder's), separated as in PATH
STANDIN_SEP = os.pathsep
#: the range of each number a gate or the loop reads, from the manifest or as an option: beyond
#: them a gate passes everything (``min_cosine`` -1e300, ``max_abs_rel`` 1e300) or nothing, and a
#: loop overflows (a shift of 1e-320 divides by zero, a timestep scale of 1e300 is inf in float32)
NUMBER_RANGES: dict[str, tuple[float, float]] = {
    "min_cosine": (-1.0, 1.0), "max_abs_rel": (0.0, 1000.0), "guidance": (-1000.0, 1000.0),
    "shift": (1e-3, 1e3), "timestep_scale": (1e-3, 1e6), "timestep_offset": (-1e6, 1e6),
    "guidance_input_scale": (-1e6, 1e6), "pipeline_timestep_scale": (1e-9, 1e9), "mu": (-1e3, 1e3),
    "negative_fill": (-1e9, 1e9),
}
#: how the loop's record says the pipeline guides (``rkpart.description`` ``cfg.mode``): a
#: conditional and an unconditional call, one call on the [uncond, cond] pair, the guidance fed
#: as an input, or none
CFG_MODES = ("two-pass", "batched", "distilled", "none")


#: the features of pipeline.json beyond version 1 as first published (``rkpart.description.FEATURES``,
#: docs/pipeline-json.md "Features") this runner's pipeline loop implements as the pipeline does; the loop
#: record lists the ones its description uses (``denoise.pipeline.features``) and the runner refuses a
#: record naming another, rather than run another loop than the pipeline's
PIPELINE_FEATURES = frozenset({
    "cfg.combine=cond + g * (cond - uncond)", "cfg.renorm=cond_l2_last_axis", "cfg.batch_order=cond,uncond",
    "cfg.channels", "inputs.negative_fill", "inputs.append_valid", "scheduler.set_timesteps.mu_rule=flux2_empirical",
    "image.num_frames", "latent.init=tokens",
})
#: ``cfg.combine``: the CFG combination of the conditional and unconditional outputs at scale ``g``, by the
#: prediction it starts from
COMBINES = {"uncond + g * (cond - uncond)": "uncond", "cond + g * (cond - uncond)": "cond"}
#: ``set_timesteps.mu_rule`` names (``sampling.MU_RULES`` computes each)
MU_RULES = ("flux2_empirical",)
#: how a PNG of a video frame is named: ``<stem>-f<frame><suffix>`` (zero-padded: a glob sorts the frames)
FRAME_NAME = "{stem}-f{frame:04d}{suffix}"


#: numbers whose range is that of their magnitude: a reversed timestep (Z-Image: ``1 - t / 1000``)
#: has a negative scale, a zero one none
SIGNED = frozenset({"timestep_scale", "pipeline_timestep_scale"})


def check_number(v: object, key: str, what: str) -> float:
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


def input_digest(a: object) -> str:
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


def read_manifest(folder: Path) -> JsonObject:
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


def _check_depth(doc: object, what: str) -> None:
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


def _name(x: object, what: str) -> str:
    if not isinstance(x, str) or not x or len(x) > MAX_NAME_CHARS or "\0" in x:
        shown = repr(x)[:80]
        raise BundleError(f"manifest: {what} must be a non-empty string without NUL bytes (at most "
                          f"{MAX_NAME_CHARS} characters), got {shown}")
    return x


def _int(x: object, what: str, lo: int = 0, hi: int = MAX_FILE_BYTES) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
        raise BundleError(f"manifest: {what} must be an integer in [{lo}, {hi}], got {repr(x)[:80]}")
    return x


def _obj(x: object, what: str) -> JsonObject:
    if not isinstance(x, dict):
        raise BundleError(f"manifest: {what} must be an object, got {type(x).__name__}")
    return x


def _list(x: object, what: str) -> list[Any]:
    if not isinstance(x, list):
        raise BundleError(f"manifest: {what} must be a list, got {type(x).__name__}")
    return x


def _relpath(rel: str, what: str) -> str:
    pp = PurePosixPath(rel)
    if pp.is_absolute() or os.path.isabs(rel) or ".." in pp.parts or "\\" in rel:
        raise BundleError(f"manifest names {rel!r}, which leaves the bundle")
    return rel


def validate_manifest(m: JsonMap) -> None:
    """Refuse a manifest any later step would trip over: the schema of every field the runner uses.

    Every stage file must be listed in ``files`` (with its sha256), so nothing the runner opens
    escapes the check.  The VAE decoder (``vae``: a graph of its own, with its stages and tensors)
    is checked the same way.
    """
    files = _obj(m.get("files"), "'files'")
    for rel, info in files.items():
        _relpath(_name(rel, "a file name"), "file")
        info = _obj(info, f"files[{rel!r}]")
        sha = info.get("sha256")
        if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise BundleError(f"manifest: files[{rel!r}].sha256 must be 64 lowercase hex digits")
        _int(info.get("size"), f"files[{rel!r}].size")
    tensors = _validate_graph(m, files, "")
    gate = _obj(m.get("gate") or {}, "'gate'")
    for k in ("min_cosine", "max_abs_rel"):
        if gate.get(k) is not None:
            check_number(gate[k], k, f"manifest: gate.{k}")
    _validate_loop(m.get("denoise"), tensors, {t["name"] for t in m["inputs"]}, {t["name"] for t in m["outputs"]})
    fixed = m["denoise"].get("fixed") if isinstance(m.get("denoise"), dict) else None
    if isinstance(fixed, dict) and fixed.get("file") not in files:
        raise BundleError(f"manifest: denoise.fixed file {fixed.get('file')!r} is not listed in 'files'")
    if isinstance(m.get("denoise"), dict) and m["denoise"].get("pipeline") is not None and SAMPLING_FILE not in files:
        raise BundleError(f"manifest: the loop's sampler {SAMPLING_FILE} is not listed in 'files'")
    if m.get("vae") is not None:
        vae = _obj(m["vae"], "'vae'")
        if vae.get("device") not in ("npu", "host"):
            raise BundleError(f"manifest: vae.device {repr(vae.get('device'))[:40]} is not npu or host")
        vt = _validate_graph(vae, files, "vae.")
        if len(vae["inputs"]) != 1 or len(vae["outputs"]) != 1:
            raise BundleError("manifest: the VAE decoder takes one input (the final latent) and gives one output "
                              "(the image)")
        shape = vt[vae["outputs"][0]["name"]]["shape"]
        if len(shape) not in (4, 5) or shape[1] not in (1, 3, 4):
            raise BundleError(f"manifest: the VAE decoder's image is {shape}, not NCHW with 1, 3 or 4 channels")
    ref = _obj(m.get("reference") or {}, "'reference'")
    for k in ("inputs", "outputs"):
        if ref.get(k) is not None:
            rel = _relpath(_name(ref[k], f"reference.{k}"), "reference")
            if rel not in files:
                raise BundleError(f"manifest: reference {k} {rel!r} is not listed in 'files'")
    if "core_mask" in m and m["core_mask"] not in CORE_MASKS:
        raise BundleError(f"manifest: core_mask {repr(m['core_mask'])[:40]} is not one of {', '.join(CORE_MASKS)}")


def _validate_graph(m: JsonMap, files: JsonMap, prefix: str) -> JsonObject:
    """The tensors, inputs, outputs and stages of one graph of the bundle (the model's, or the VAE
    decoder's under ``prefix`` ``vae.``); returns its ``tensors``."""
    tensors = _obj(m.get("tensors"), f"'{prefix}tensors'")
    for name, t in tensors.items():
        _name(name, "a tensor name")
        t = _obj(t, f"{prefix}tensors[{name!r}]")
        shape = _list(t.get("shape"), f"{prefix}tensors[{name!r}].shape")
        if len(shape) > 16:
            raise BundleError(f"manifest: {prefix}tensors[{name!r}].shape has {len(shape)} dimensions (at most 16)")
        n = 1
        for d in shape:
            n *= _int(d, f"{prefix}tensors[{name!r}].shape", 0, MAX_TENSOR_ELEMENTS)
        if n > MAX_TENSOR_ELEMENTS:
            raise BundleError(f"manifest: {prefix}tensors[{name!r}] has {n} elements (at most {MAX_TENSOR_ELEMENTS})")
        if t.get("dtype") not in DTYPES:
            raise BundleError(f"manifest: {prefix}tensors[{name!r}].dtype {repr(t.get('dtype'))[:40]} is not one of "
                              f"{', '.join(DTYPES)}")
    for key in ("inputs", "outputs"):
        for i, t in enumerate(_list(m.get(key), f"'{prefix}{key}'")):
            tname = _name(_obj(t, f"{prefix}{key}[{i}]").get("name"), f"{prefix}{key}[{i}].name")
            if tname not in tensors:
                raise BundleError(f"manifest: {prefix}{key[:-1]} {tname!r} has no entry in '{prefix}tensors'")
    if not m["outputs"]:
        raise BundleError(f"manifest: '{prefix}outputs' is empty (nothing to run for)")
    stages = _list(m.get("stages"), f"'{prefix}stages'")
    if not stages:
        raise BundleError(f"manifest: '{prefix}stages' is empty")
    for i, s in enumerate(stages):
        s = _obj(s, f"{prefix}stages[{i}]")
        sid = _name(s.get("id"), f"{prefix}stages[{i}].id")
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
                    raise BundleError(f"manifest: stage {sid} {key[:-1]} {t!r} has no entry in '{prefix}tensors'")
        if "residency" in s and s["residency"] not in RESIDENCIES:
            raise BundleError(f"manifest: stage {sid}: residency {repr(s['residency'])[:40]} is not one of "
                              f"{', '.join(RESIDENCIES)}")
        if s["device"] == "npu" and "source" in s:
            _relpath(_name(s["source"], f"stage {sid} source"), "source")
        if s.get("source_sha256") is not None and not isinstance(s["source_sha256"], str):
            raise BundleError(f"manifest: stage {sid}: source_sha256 must be a string")
    # data flow: every stage reads only model inputs and earlier stages' outputs
    label = "VAE decoder" if prefix else "model"
    have = {t["name"] for t in m["inputs"]}
    for s in stages:
        missing = [t for t in s["inputs"] if t not in have]
        if missing:
            raise BundleError(f"manifest: stage {s['id']} reads {missing[0]!r}, which no {label} input or earlier "
                              "stage gives")
        have.update(s["outputs"])
    for t in m["outputs"]:
        if t["name"] not in have:
            raise BundleError(f"manifest: {label} output {t['name']!r} is given by no stage")
    return dict(tensors)


def _validate_loop(d: object, tensors: JsonMap, inputs: set[str] | None = None,
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
    if d.get("pipeline") is not None:
        _validate_pipeline(_obj(d["pipeline"], "denoise.pipeline"), tensors)


def _validate_pipeline(p: JsonMap, tensors: JsonMap) -> None:
    """The loop record's ``pipeline`` (the pipeline's own sampler): names, numbers in range."""
    _name(p.get("class"), "denoise.pipeline.class")
    smp = _obj(p.get("sampler"), "denoise.pipeline.sampler")
    _name(smp.get("class"), "denoise.pipeline.sampler.class")
    _obj(smp.get("config"), "denoise.pipeline.sampler.config")
    if smp.get("rule") is not None:
        _name(smp["rule"], "denoise.pipeline.sampler.rule")
    if smp.get("mu") is not None:
        check_number(smp["mu"], "mu", "manifest: denoise.pipeline.sampler.mu")
    ts = _obj(p.get("timestep"), "denoise.pipeline.timestep")
    check_number(ts.get("scale"), "pipeline_timestep_scale", "manifest: denoise.pipeline.timestep.scale")
    check_number(ts.get("offset"), "timestep_offset", "manifest: denoise.pipeline.timestep.offset")
    lat = _obj(p.get("latent"), "denoise.pipeline.latent")
    shape = _list(lat.get("shape"), "denoise.pipeline.latent.shape")
    n = 1
    for x in shape:
        n *= _int(x, "denoise.pipeline.latent.shape", 1, MAX_TENSOR_ELEMENTS)
    if not shape or len(shape) > 16 or n > MAX_TENSOR_ELEMENTS:
        raise BundleError(f"manifest: denoise.pipeline.latent.shape {shape[:17]} is not a tensor shape")
    if lat.get("dtype") not in ("float16", "float32", "float64"):
        raise BundleError(f"manifest: denoise.pipeline.latent.dtype {repr(lat.get('dtype'))[:40]} is not a float")
    if lat.get("init", "identity") not in ("identity", "init_noise_sigma", "tokens"):
        raise BundleError(f"manifest: denoise.pipeline.latent.init {repr(lat.get('init'))[:40]} is not identity, "
                          "init_noise_sigma or tokens")
    if lat.get("init") == "tokens" and len(shape) < 3:
        raise BundleError(f"manifest: denoise.pipeline.latent.init tokens needs a (B, C, *positions) shape, not "
                          f"{shape}")
    used = _list(p.get("features") or [], "denoise.pipeline.features")
    unknown = sorted(str(f)[:80] for f in used if f not in PIPELINE_FEATURES)
    if unknown:
        raise BundleError(f"manifest: the pipeline's loop uses {', '.join(unknown)}, which this runner does not "
                          "implement (docs/pipeline-json.md, Features)")
    if smp.get("mu_rule") is not None:
        if smp["mu_rule"] not in MU_RULES:
            raise BundleError(f"manifest: denoise.pipeline.sampler.mu_rule {repr(smp['mu_rule'])[:40]} is not one of "
                              f"{', '.join(MU_RULES)}")
        _int(smp.get("image_seq_len"), "denoise.pipeline.sampler.image_seq_len", 1, MAX_TENSOR_ELEMENTS)
    cfg = _obj(p.get("cfg") or {}, "denoise.pipeline.cfg")
    if cfg.get("combine") is not None and cfg["combine"] not in COMBINES:
        raise BundleError(f"manifest: denoise.pipeline.cfg.combine {repr(cfg['combine'])[:60]} is not one of "
                          f"{', '.join(COMBINES)}")
    if cfg.get("renorm") not in (None, "cond_l2_last_axis"):
        raise BundleError(f"manifest: denoise.pipeline.cfg.renorm {repr(cfg['renorm'])[:40]} is not "
                          "cond_l2_last_axis or null")
    if cfg.get("batch_order", "uncond,cond") not in ("uncond,cond", "cond,uncond"):
        raise BundleError(f"manifest: denoise.pipeline.cfg.batch_order {repr(cfg['batch_order'])[:40]} is not "
                          "uncond,cond or cond,uncond")
    if cfg.get("channels") is not None:
        _int(cfg["channels"], "denoise.pipeline.cfg.channels", 1, MAX_TENSOR_ELEMENTS)
    if p.get("num_frames") is not None:
        _int(p["num_frames"], "denoise.pipeline.num_frames", 1, MAX_TENSOR_ELEMENTS)
    for name, e in _obj(p.get("embeds") or {}, "denoise.pipeline.embeds").items():
        if name not in tensors:
            raise BundleError(f"manifest: denoise.pipeline.embeds input {name!r} has no entry in 'tensors'")
        e = _obj(e, f"denoise.pipeline.embeds[{name!r}]")
        for k in ("argument", "negative_argument"):
            if e.get(k) is not None:
                _name(e[k], f"denoise.pipeline.embeds[{name!r}].{k}")
        if e.get("negative_fill") is not None:
            check_number(e["negative_fill"], "negative_fill", f"manifest: denoise.pipeline.embeds[{name!r}]."
                                                              "negative_fill")
        n_valid = _int(e.get("append_valid", 0), f"denoise.pipeline.embeds[{name!r}].append_valid", 0,
                       MAX_TENSOR_ELEMENTS)
        tshape = tensors[name]["shape"]
        if n_valid and (not tshape or tshape[-1] <= n_valid):
            raise BundleError(f"manifest: denoise.pipeline.embeds[{name!r}] appends {n_valid} valid positions to an "
                              f"input of shape {tshape}")
    if p.get("guidance_scale") is not None:
        check_number(p["guidance_scale"], "guidance", "manifest: denoise.pipeline.guidance_scale")


def unlisted_files(folder: Path, manifest: JsonMap) -> list[str]:
    """Files in the folders of the stage files (``stages/``, ``rknn/``...) that ``files`` does not
    list: ONNX Runtime would open an unlisted ``.data`` file next to a stage without any check."""
    listed = set(manifest["files"])
    stages = [*manifest["stages"], *((manifest.get("vae") or {}).get("stages") or [])]
    tops = sorted({PurePosixPath(s["file"]).parts[0] for s in stages if len(PurePosixPath(s["file"]).parts) > 1})
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


def verify_files(folder: Path, manifest: JsonMap) -> None:
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


def standin_folders(value: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> tuple[Path, ...]:
    """The plan folders of an ONNX Runtime stand-in: one folder, or several joined by ``os.pathsep``."""
    parts: list[str | os.PathLike[str]]
    if isinstance(value, str):
        parts = [p for p in value.split(STANDIN_SEP) if p]
    elif isinstance(value, os.PathLike):
        parts = [value]
    else:
        parts = list(value)
    if not parts:
        raise BundleError(f"{STANDIN_ENV} names no folder")
    return tuple(Path(p) for p in parts)


def _stage_digest(src: Path) -> str:
    h = hashlib.sha256()
    for p in (src, src.with_name(src.name + ".data")):
        if p.is_file():
            with open(p, "rb") as f:
                while buf := f.read(1 << 22):
                    h.update(buf)
    return h.hexdigest()


def standin_file(folders: Path | Sequence[Path], rel: str, sha256: str | None) -> Path:
    """The ``.onnx`` of an NPU stage for the ONNX Runtime stand-in, checked against the stage's sha256.

    ``folders``: the plan folders the bundle was made from (the model's, the VAE decoder's); the
    stage's file is the first ``folder/rel`` whose digest is the stage's.  The stage digest is the
    sha256 of the ``.onnx`` bytes followed by its ``.data`` bytes (if any).
    """
    roots = [folders] if isinstance(folders, Path) else list(folders)
    found: list[Path] = []
    for root in roots:
        src = inside(root, rel)
        if not src.is_file():
            continue
        if sha256 is None or _stage_digest(src) == sha256:
            return src
        found.append(src)
    if found:
        raise BundleError(f"ONNX Runtime stand-in: {found[0]} is not the stage the bundle was made from (sha256)")
    raise BundleError(f"ONNX Runtime stand-in: no {rel} under {', '.join(str(r) for r in roots)}")


_SAMPLING: JsonObject = {}


def sampling_module(folder: Path) -> Any:
    """diffusers' schedulers in NumPy: ``rkpart.runtime.board_sampling`` inside rkpart, else the
    bundle's own ``sampling.py`` (checked against the manifest with every other file)."""
    if __package__ == "rkpart.runtime":
        from rkpart.runtime import board_sampling

        return board_sampling
    path = (folder / SAMPLING_FILE).resolve()
    if str(path) in _SAMPLING:
        return _SAMPLING[str(path)]
    if not path.is_file():
        raise BundleError(f"{folder / SAMPLING_FILE} is missing: the pipeline's sampler ships beside runner.py")
    import importlib.util

    name = f"_rkpart_bundle_sampling_{len(_SAMPLING)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise BundleError(f"cannot import {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    # no __pycache__/ written into the bundle: it stays as shipped (the manifest lists every file, and
    # a read-only or byte-compared bundle folder must not change because it ran)
    writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.dont_write_bytecode = writes
    _SAMPLING[str(path)] = mod
    return mod


class CallInputs(NamedTuple):
    """What the pipeline's sampler takes from the diffusers call (``--embeds``, ``--latents``,
    ``--step-noise``): its arguments by name, its ``latents=`` and, for a stochastic sampler, the
    noise of each step; ``None`` each: drawn from the seed as the runner documents.  (A NamedTuple,
    not a dataclass: the tests load runner.py as a plain file, outside ``sys.modules``.)"""

    embeds: JsonMap | None = None
    latents: Any = None
    step_noise: Sequence[Any] | None = None


class Runner:
    """Runs a bundle pass by pass; keep one open for a whole denoising loop.

    ``residency`` and ``core_mask`` override the manifest's; ``npu_standin`` (a folder, or
    several: the model's plan folder and the VAE decoder's) replaces the NPU by ONNX Runtime on the
    stages' ``.onnx`` files (never the board's way).  ``graph`` ``"vae"`` runs the bundle's VAE
    decoder instead of the model (:meth:`decode` opens one).
    """

    def __init__(self, folder: str | os.PathLike[str] = ".", *, residency: str | None = None,
                 core_mask: str | None = None,
                 npu_standin: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
                 verify: bool = True, rknnlite_api: Any = None, cfg_parallel: bool = False,
                 graph: str | None = None, manifest: JsonMap | None = None) -> None:
        self.folder = Path(folder)
        self.manifest = dict(manifest) if manifest is not None else read_manifest(self.folder)
        if verify:
            verify_files(self.folder, self.manifest)
        if residency is not None and residency not in RESIDENCIES:
            raise BundleError(f"residency {residency!r} is not one of {', '.join(RESIDENCIES)}")
        self.core_mask = core_mask or str(self.manifest.get("core_mask", "auto"))
        if self.core_mask not in CORE_MASKS:
            raise BundleError(f"core mask {self.core_mask!r} is not one of {', '.join(CORE_MASKS)}")
        if npu_standin is None:
            npu_standin = os.environ.get(STANDIN_ENV) or None
        #: the stand-in's plan folders (None: the NPU); ``npu_standin`` is the first
        self.npu_standins = standin_folders(npu_standin) if npu_standin is not None else None
        self.npu_standin = self.npu_standins[0] if self.npu_standins else None
        if graph not in (None, "vae"):
            raise BundleError(f"graph {graph!r} is not the model (None) or 'vae'")
        if graph is not None and not isinstance(self.manifest.get(graph), dict):
            raise BundleError("this bundle has no VAE decoder (rkpart bundle --vae npu|host with a pipeline.json)")
        self.graph = graph
        g: JsonMap = self.manifest if graph is None else self.manifest[graph]
        self._graph = g
        self._residency_override = residency
        self._verify = verify
        self._vae: Runner | None = None
        self.inputs = tuple(t["name"] for t in g["inputs"])
        self.outputs = tuple(t["name"] for t in g["outputs"])
        self.tensors: dict[str, JsonObject] = dict(g["tensors"])
        self.stages: list[JsonObject] = list(g["stages"])
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
        self._open: JsonObject = {}  # stage id -> initialised session (resident stages)
        #: two contexts of every NPU stage, one per CFG pass, on NPU cores 0 and 1 (:meth:`run_passes`)
        self.cfg_parallel = bool(cfg_parallel)
        self._open_lane1: JsonObject = {}  # the second pass's resident sessions under cfg_parallel
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
    def stage_core_mask(self, s: JsonMap, lane: int = 0) -> str:
        """The core mask a stage's context is initialised with: under ``cfg_parallel`` core 0 for
        the first pass and core 1 for the second; else ``--core-mask``, the stage's, the manifest's."""
        if self.cfg_parallel:
            return CFG_LANE_MASKS[lane]
        return self._core_mask_override or str(s.get("core_mask") or self.core_mask)

    def _session(self, s: JsonMap, lane: int = 0) -> Any:
        ins, outs = tuple(s["inputs"]), tuple(s["outputs"])
        if s["device"] != "npu":
            return OrtSession(inside(self.folder, s["file"]), ins, outs)
        if self.npu_standins is not None:
            return OrtSession(standin_file(self.npu_standins, s["source"], s.get("source_sha256")), ins, outs)
        if self._api is None:
            self._api = import_rknnlite()
        return RknnLiteSession(inside(self.folder, s["file"]), CORE_MASKS[self.stage_core_mask(s, lane)], self._api,
                               s["id"], str(s.get("precision", "fp16")))

    def _timed(self, sid: str, phase: str, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args)
        self._sink.append((sid, phase, time.perf_counter() - t0))
        return out

    def _start(self, s: JsonMap, lane: int = 0) -> Any:
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
    def check_inputs(self, inputs: JsonMap) -> dict[str, np.ndarray]:
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
        for rec in self._graph.get("specialised", ()):
            for n, digest in sorted(rec["inputs"].items()):
                if n in feeds and input_digest(feeds[n]) != digest:
                    raise BundleError(f"input {n!r} differs from the one this plan was specialised to ({rec['op']} "
                                      f"node {rec['node']!r} gave {rec['tensor']!r} the shape {rec['shape']}); "
                                      "partition again with --inputs holding these inputs")
        return feeds

    def run(self, inputs: JsonMap) -> dict[str, np.ndarray]:
        """One pass through every stage in order; returns the model outputs by name."""
        self.open()
        self.timings = self._sink = []
        env = self.check_inputs(inputs)
        for k, s in enumerate(self.stages):
            self._stage_passes(s, [env])
            for name in self._drop[k]:
                env.pop(name, None)
        return {n: env[n] for n in self.outputs}

    def _call_stage(self, s: JsonMap, sess: Any, env: dict[str, np.ndarray]) -> None:
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
    def run_passes(self, passes: Sequence[JsonMap]) -> list[dict[str, np.ndarray]]:
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

    def _stage_passes(self, s: JsonMap, envs: list[dict[str, np.ndarray]]) -> None:
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

    def _stage_lane(self, s: JsonMap, lane: int, env: dict[str, np.ndarray],
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
    def loop(self) -> JsonObject:
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

    @property
    def pipeline(self) -> JsonObject | None:
        """The loop record's ``pipeline``: the pipeline's own sampler, timestep rule, latent and call
        arguments (from its ``pipeline.json``); ``None`` for a bundle without a description."""
        d = self.manifest.get("denoise")
        p = d.get("pipeline") if isinstance(d, dict) and "error" not in d else None
        return p if isinstance(p, dict) else None

    def default_scheduler(self) -> str:
        """``pipeline`` when the bundle carries the pipeline's sampler, else ``flow-euler``."""
        return "pipeline" if self.pipeline is not None else "flow-euler"

    def denoise(self, steps: int, *, guidance: float | None = None, seed: int = 0, shift: float | None = None,
                scheduler: str | None = None, cond: JsonMap | None = None,
                uncond: JsonMap | None = None, cfg: bool = True,
                on_step: Callable[[int, dict[str, float]], None] | None = None,
                call: CallInputs | None = None) -> np.ndarray:
        """A whole denoising loop; returns the final latent.

        ``scheduler`` ``pipeline`` (the default of a bundle with a pipeline description) is
        :meth:`sample`: the pipeline's own sampler on ``call`` (:class:`CallInputs`: diffusers call
        arguments, the call's ``latents=`` and the steps' noise).  ``flow-euler`` (the default
        without a description) is ``rkpart drift``'s sampler, as the manifest's ``denoise`` record
        gives it: the initial
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
        embeds, latents, step_noise = (call.embeds, call.latents, call.step_noise) if call else (None, None, None)
        d = self.loop
        scheduler = scheduler or self.default_scheduler()
        if scheduler not in SCHEDULERS:
            raise BundleError(f"scheduler {scheduler!r} is not one of {', '.join(SCHEDULERS)}")
        if scheduler == "pipeline":
            if cond is not None or uncond is not None or shift is not None:
                raise BundleError("--cond / --uncond / --shift belong to the flow-euler loop; the pipeline's sampler "
                                  "takes --embeds (its call arguments) and its own schedule")
            return self.sample(steps, guidance=guidance, seed=seed, embeds=embeds, latents=latents,
                               step_noise=step_noise, cfg=cfg, on_step=on_step)
        if embeds is not None or latents is not None or step_noise is not None:
            raise BundleError("--embeds / --latents / --step-noise belong to the pipeline's sampler (--scheduler "
                              "pipeline), not to the flow-euler loop")
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

    # -- the pipeline's own loop (issue 49) -----------------------------------------------------
    def scheduler(self) -> Any:
        """A fresh scheduler of the pipeline (``sampling.make_scheduler`` on the recorded config)."""
        p = self.pipeline
        if p is None:
            raise BundleError("this bundle carries no pipeline description: its loop is rkpart drift's flow-euler "
                              "(partition a model exported by `rkpart export` to get the pipeline's sampler)")
        bs = sampling_module(self.folder)
        smp = p["sampler"]
        try:
            return bs.make_scheduler(smp["class"], json_numbers(smp["config"]))
        except bs.SamplerError as e:
            raise BundleError(f"the pipeline's sampler: {e}") from None

    def timesteps(self, steps: int) -> tuple[Any, np.ndarray]:
        """``(scheduler, timesteps)`` for ``steps`` (``num_inference_steps``), as the pipeline's
        ``retrieve_timesteps`` makes them: its schedule rule and ``mu``."""
        if not 1 <= steps <= MAX_COUNT:
            raise BundleError(f"--steps must be in [1, {MAX_COUNT}], got {steps}")
        p = self.pipeline
        assert p is not None
        bs = sampling_module(self.folder)
        sched = self.scheduler()
        smp = p["sampler"]
        try:
            mu = smp.get("mu")
            if smp.get("mu_rule") is not None:  # mu of the step count (Flux.2): the pipeline computes it per call
                mu = bs.MU_RULES[smp["mu_rule"]](int(smp["image_seq_len"]), steps)
            ts, _ = bs.retrieve_timesteps(sched, steps, rule=smp.get("rule"), mu=mu)
        except bs.SamplerError as e:
            raise BundleError(f"the pipeline's sampler at {steps} steps: {e}") from None
        return sched, np.asarray(ts)

    def pipeline_guidance(self, guidance: float | None) -> float:
        p, d = self.pipeline or {}, self.loop
        g = guidance if guidance is not None else p.get("guidance_scale", d.get("guidance", 4.0))
        return check_number(g if g is not None else 4.0, "guidance", "--guidance")

    def do_cfg(self, guidance: float, cfg: bool = True) -> bool:
        """Whether a step runs the unconditional pass: CFG pipelines do when ``guidance_scale > 1``
        (diffusers' ``do_classifier_free_guidance``), never under distilled guidance or none."""
        return cfg and str(self.loop.get("cfg_mode", "two-pass")) in ("two-pass", "batched") and guidance > 1.0

    def load_embeds(self, path: str | os.PathLike[str], *, uncond: bool) -> tuple[dict[str, np.ndarray],
                                                                                 dict[str, np.ndarray]]:
        """``--embeds FILE.npz`` (keys: the pipeline's call arguments) as the conditional and the
        unconditional pass's inputs (:meth:`embeds_inputs`)."""
        p = self.pipeline or {}
        wanted = sorted({a for e in (p.get("embeds") or {}).values() for a in (e.get("argument"),
                                                                               e.get("negative_argument")) if a})
        arrays = load_npz(path, "--embeds", names=wanted)
        keys = ", ".join(sorted(npz_keys(path))) or "none"
        return self.embeds_inputs(arrays, uncond=uncond, what=f"--embeds {path}", keys=keys)

    def embeds_inputs(self, arrays: JsonMap, *, uncond: bool, what: str = "embeds",
                      keys: str | None = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The model inputs the call arguments ``arrays`` give, per pass: each input the record maps
        takes its ``argument`` in the conditional pass and its ``negative_argument`` in the
        unconditional one (``uncond``: that pass runs), or there its argument's shape filled with its
        ``negative_fill`` (CogView3-Plus' zeros, DiT's null class); an input with ``append_valid`` is
        its argument extended with that many ones on the last axis (Chroma's mask: the image tokens).
        Under ``batched`` an argument holds one row.

        Raises :class:`BundleError` (one line) for a missing key, another shape, a dtype of another
        kind, or NaN/Inf values."""
        p = self.pipeline or {}
        batched = str(self.loop.get("cfg_mode")) == "batched"
        roles = self.loop.get("roles") or {}
        out: dict[str, dict[str, np.ndarray]] = {"cond": {}, "uncond": {}}
        shown = keys if keys is not None else (", ".join(sorted(arrays)) or "none")
        for name, e in sorted((p.get("embeds") or {}).items()):
            info = self.tensors[name]
            want = np.dtype(info["dtype"])
            shape = tuple(info["shape"])
            shape = (shape[0] // 2, *shape[1:]) if batched else shape
            n_valid = int(e.get("append_valid") or 0)
            arg_shape = (*shape[:-1], shape[-1] - n_valid) if n_valid else shape
            fill = e.get("negative_fill")
            for which, arg in (("cond", e.get("argument")), ("uncond", e.get("negative_argument"))):
                if which == "uncond" and uncond and fill is not None:
                    out[which][name] = _append_valid(np.full(arg_shape, fill, want), n_valid)
                    continue
                if arg is None or (which == "uncond" and not uncond):
                    continue
                if arg not in arrays and roles.get(name) == "attention_mask":
                    continue  # as the pipelines do without the argument: every token valid (the fixed ones)
                if arg not in arrays:
                    raise BundleError(f"{what} has no {arg!r} (input {name!r}, {which} pass; its keys: {shown})")
                a = np.asarray(arrays[arg])
                if tuple(a.shape) != arg_shape:
                    raise BundleError(f"{what}: {arg!r} is {list(a.shape)}; input {name!r} takes {list(arg_shape)}"
                                      + (" (one row of its batch-2 CFG pair)" if batched else "")
                                      + (f" and appends {n_valid} valid positions" if n_valid else ""))
                mask = roles.get(name) == "attention_mask"
                ok = a.dtype == want or (a.dtype.kind == want.kind == "f") or (
                    mask and a.dtype.kind in "biuf" and want.kind in "biuf")
                if not ok:
                    raise BundleError(f"{what}: {arg!r} is {a.dtype}; input {name!r} takes {want}")
                if a.dtype.kind == "f" and not np.isfinite(a).all():
                    raise BundleError(f"{what}: {arg!r} holds NaN/Inf values")
                out[which][name] = _append_valid(a.astype(want, copy=False), n_valid)
        return out["cond"], out["uncond"]

    def initial_latent(self, latents: object, rng: np.random.Generator) -> np.ndarray:
        """The call's ``latents=`` (given: shape and dtype checked, finite), else drawn from ``rng``
        (standard normal, the description's dtype)."""
        p = self.pipeline
        assert p is not None
        shape, dtype = tuple(p["latent"]["shape"]), np.dtype(p["latent"]["dtype"])
        if latents is None:
            return rng.standard_normal(shape).astype(dtype)
        a = np.asarray(latents)
        if tuple(a.shape) != shape:
            raise BundleError(f"--latents is {list(a.shape)}; the pipeline's latents= is {list(shape)} {dtype}")
        if a.dtype.kind != "f":
            raise BundleError(f"--latents is {a.dtype}; the pipeline's latents= is {dtype}")
        if not np.isfinite(a).all():
            raise BundleError(f"--latents holds {int(np.count_nonzero(~np.isfinite(a)))} NaN/Inf values")
        return a.astype(dtype)

    def sample(self, steps: int, *, guidance: float | None = None, seed: int = 0,
               embeds: JsonMap | None = None, latents: Any = None,
               step_noise: Sequence[Any] | None = None, cfg: bool = True,
               on_step: Callable[[int, dict[str, float]], None] | None = None) -> np.ndarray:
        """The pipeline's own denoising loop; returns the final latent, as ``pipe(...,
        output_type="latent")`` returns it.

        As the bundle's pipeline record (from ``pipeline.json``) says: the scheduler class and
        config, stepped by ``sampling.py``; ``set_timesteps`` with the pipeline's schedule rule and
        ``mu``; the model's timestep ``scale * t + offset``; CFG two-pass, batched, distilled
        (``guidance`` fed to the guidance input) or none, the conditional pass only when
        ``guidance <= 1`` (diffusers' rule); the learned-sigma half dropped and the sign applied;
        ``latents`` times ``init_noise_sigma`` where the pipeline does so.

        ``embeds``: the conditioning as the diffusers call arguments (``prompt_embeds``, ...; see
        :meth:`embeds_inputs`); without it, the conditioning is drawn from ``seed`` after the
        latent (zeros for the unconditional pass), which is no prompt.  ``latents``: the initial
        noise as the call's ``latents=``; without it drawn from ``numpy.random.default_rng(seed)``.
        Samplers that draw noise while stepping (DDPM, ancestral, SDE) take their draws from
        ``step_noise`` (in order: what diffusers' generator drew, for reproducing it) or from the
        same generator.
        """
        d, p = self.loop, self.pipeline
        if p is None:
            raise BundleError("this bundle carries no pipeline description: --scheduler pipeline needs one")
        mode = str(d.get("cfg_mode", "two-pass"))
        g = self.pipeline_guidance(guidance)
        use_cfg = self.do_cfg(g, cfg)
        if self.cfg_parallel and not (use_cfg and mode == "two-pass"):
            raise BundleError(f"--cfg-parallel runs the two CFG passes at once; this run makes one call per step "
                              f"({mode}{', guidance <= 1' if mode == 'two-pass' and cfg else ''})")
        sched, timesteps = self.timesteps(steps)
        ts = p["timestep"]
        scale = check_number(ts["scale"], "pipeline_timestep_scale", "timestep scale")
        offset = check_number(ts["offset"], "timestep_offset", "timestep offset")
        gscale = check_number(d.get("guidance_input_scale", 1.0), "guidance_input_scale", "guidance_input_scale")
        sign = float(d.get("output_sign", 1))
        learned, axis = bool(d.get("learned_sigma", False)), int(d.get("channels_axis", 1))
        lat_name, ts_name, out_name = d["latent"], d["timestep"], d.get("output") or self.outputs[0]
        g_name = d.get("guidance_input")
        batched = mode == "batched"
        cfg_rec: JsonMap = p.get("cfg") or {}
        cond_first = cfg_rec.get("batch_order") == "cond,uncond"  # Lumina-Next, Z-Image, DiT: [cond, uncond]
        rng = np.random.default_rng(seed)
        x = self.initial_latent(latents, rng)
        if p["latent"].get("init") == "tokens":  # Flux.2: (B, C, *positions) -> row-major tokens (B, N, C)
            x = np.ascontiguousarray(x.reshape(*x.shape[:2], -1).transpose(0, 2, 1))
        in_shape = self._loop_shape(lat_name, batched)
        if _squeezed(x.shape) != _squeezed(in_shape):
            raise BundleError(f"the pipeline's latents= {list(x.shape)} is not the model's latent input "
                              f"{self.tensors[lat_name]['shape']}; rkpart's loop cannot step it")
        fixed = self.loop_fixed()
        if embeds is not None:
            c, u = self.embeds_inputs(embeds, uncond=use_cfg)
        else:
            c, u = {}, {}
        fills = {n: e["negative_fill"] for n, e in (p.get("embeds") or {}).items()
                 if e.get("negative_fill") is not None}
        drawn = [t for t in d["context"] if t not in c]
        for t in drawn:  # no --embeds: seeded noise, as rkpart drift (no prompt: a check of the loop only)
            info = self.tensors[t]
            shape = tuple(info["shape"])
            c[t] = rng.standard_normal((shape[0] // 2, *shape[1:]) if batched else shape).astype(info["dtype"])
            if t not in u:
                u[t] = np.full_like(c[t], fills[t]) if t in fills else np.zeros_like(c[t])
        if not use_cfg:
            u = dict(c)  # the pair's unconditional row (batched) is never read
        noise = step_noise_fn(step_noise, rng)
        if p["latent"].get("init") == "init_noise_sigma":
            x = (x * np.float32(sched.init_noise_sigma)).astype(x.dtype)
        lat_dtype = np.dtype(self.tensors[lat_name]["dtype"])

        def pair(cond: np.ndarray, uncond: np.ndarray) -> np.ndarray:
            return np.concatenate([cond, uncond] if cond_first else [uncond, cond])

        self.step_timings = []
        self.open()
        for i, t in enumerate(timesteps):
            t0 = time.perf_counter()
            tinfo = self.tensors[ts_name]
            common = {**fixed, ts_name: np.full(tuple(tinfo["shape"]), scale * float(t) + offset,
                                                dtype=np.dtype(tinfo["dtype"]))}
            if g_name is not None:
                gi = self.tensors[g_name]
                common[g_name] = np.full(tuple(gi["shape"]), g * gscale, dtype=np.dtype(gi["dtype"]))
            # the latent as the model input holds it (Z-Image's added frame axis: the same values)
            xin = x.astype(lat_dtype, copy=False).reshape(in_shape)
            if batched:
                feeds = [{**common, lat_name: np.concatenate([xin, xin]), **{n: pair(c[n], u[n]) for n in c}}]
            else:
                feeds = [{**common, lat_name: xin, **c}] + ([{**common, lat_name: xin, **u}] if use_cfg else [])
            outs = self.run_passes(feeds)
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                if batched:
                    first, second = np.split(np.asarray(outs[0][out_name], dtype=np.float32), 2)
                    vc, vu = (first, second) if cond_first else (second, first)
                else:
                    vc = np.asarray(outs[0][out_name], dtype=np.float32)
                    vu = np.asarray(outs[1][out_name], dtype=np.float32) if use_cfg else vc
                v = cfg_combine(vc, vu, g, cfg_rec, axis) if use_cfg else vc
                if learned:
                    v = np.split(v, 2, axis=axis)[0]
                if sign != 1:
                    v = v * np.float32(sign)
            v = v.reshape(x.shape)  # a singleton axis of the output is not the latent's
            bs = sampling_module(self.folder)
            try:
                x = np.asarray(sched.step(v, t, x, generator_noise=noise))
            except bs.SamplerError as e:
                raise BundleError(f"the pipeline's sampler, step {i + 1}: {e}") from None
            timing = summed(self.timings, time.perf_counter() - t0)
            self.step_timings.append(timing)
            if on_step is not None:
                on_step(i, timing)
        return x

    def _loop_shape(self, lat_name: str, batched: bool) -> tuple[int, ...]:
        shape = tuple(self.tensors[lat_name]["shape"])
        return (shape[0] // 2, *shape[1:]) if batched else shape

    def calls_per_step(self, guidance: float | None = None, cfg: bool = True) -> int:
        """Model calls one step of the pipeline's loop makes: 2 for two-pass CFG, else 1 (a batched
        pair is one call of batch 2; distilled guidance one call)."""
        mode = str(self.loop.get("cfg_mode", "two-pass"))
        g = self.pipeline_guidance(guidance) if self.pipeline is not None else float(self.loop.get("guidance", 4.0))
        return 2 if mode == "two-pass" and (self.do_cfg(g, cfg) if self.pipeline is not None else cfg) else 1

    # -- the VAE decoder ---------------------------------------------------------------------
    @property
    def has_vae(self) -> bool:
        return self.graph is None and isinstance(self.manifest.get("vae"), dict)

    def vae_runner(self) -> Runner:
        """The bundle's VAE decoder as a runner of its own (its stages, residency and core masks)."""
        if self._vae is None:
            self._vae = Runner(self.folder, residency=self._residency_override, core_mask=self._core_mask_override,
                               npu_standin=self.npu_standins, verify=False, rknnlite_api=self._api,
                               manifest=self.manifest, graph="vae")
        return self._vae

    def decode(self, latent: object) -> np.ndarray:
        """The image (NCHW float32 in [0, 1], what ``output_type="np"`` returns, transposed; a video
        pipeline's frames NCFHW) of the final latent, by the bundle's VAE decoder (the pipeline's whole
        post-loop path)."""
        vae = self.vae_runner()
        name = vae.inputs[0]
        info = vae.tensors[name]
        a = np.asarray(latent)
        if tuple(a.shape) != tuple(info["shape"]):
            raise BundleError(f"the VAE decoder takes a latent of {info['shape']}, not {list(a.shape)}")
        with vae:
            out = vae.run({name: a.astype(np.dtype(info["dtype"]), copy=False)})
        return np.asarray(out[vae.outputs[0]], dtype=np.float32)

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

    def _conditioning(self, arrays: JsonMap, what: str,
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


def _append_valid(a: np.ndarray, n: int) -> np.ndarray:
    """``a`` extended with ``n`` ones (valid positions) on its last axis (pipeline.json ``append_valid``)."""
    return a if not n else np.concatenate([a, np.ones((*a.shape[:-1], n), a.dtype)], axis=-1)


def _squeezed(shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` without its axes of one: a latent and a model input that holds it with a singleton axis
    the pipeline adds (Z-Image's frame axis) are the same values."""
    return tuple(int(n) for n in shape if n != 1)


def cfg_combine(cond: np.ndarray, uncond: np.ndarray, g: float, cfg: JsonMap, axis: int) -> np.ndarray:
    """The CFG combination of the conditional and unconditional outputs (float32, as the model returns
    them) as the loop record's ``cfg`` says (docs/pipeline-json.md, ``cfg``): ``combine`` (from
    ``uncond`` or from ``cond``), then ``renorm`` (``cond_l2_last_axis``: rescaled to ``cond``'s L2 norm
    over the last axis), on the first ``channels`` channels of ``axis`` only (the rest ``cond``'s)."""
    k = cfg.get("channels")
    if k is not None and k < cond.shape[axis]:
        head = cfg_combine(np.take(cond, range(k), axis=axis), np.take(uncond, range(k), axis=axis), g,
                           {**cfg, "channels": None}, axis)
        return np.concatenate([head, np.take(cond, range(k, cond.shape[axis]), axis=axis)], axis=axis)
    base = cond if COMBINES[cfg.get("combine") or "uncond + g * (cond - uncond)"] == "cond" else uncond
    x = base + np.float32(g) * (cond - uncond)
    if cfg.get("renorm") == "cond_l2_last_axis":
        x = x * (np.linalg.norm(cond, axis=-1, keepdims=True) / np.linalg.norm(x, axis=-1, keepdims=True))
    return np.asarray(x, dtype=np.float32)


def json_numbers(v: object) -> Any:
    """A config as pipeline.json spells it, with its non-finite numbers (written as the strings
    ``"Infinity"``, ``"-Infinity"``, ``"NaN"``: DPM-Solver's ``lambda_min_clipped``) as floats."""
    if isinstance(v, str) and v in ("Infinity", "-Infinity", "NaN"):
        return float(v)
    if isinstance(v, dict):
        return {k: json_numbers(x) for k, x in v.items()}
    if isinstance(v, list):
        return [json_numbers(x) for x in v]
    return v


def npz_keys(path: str | os.PathLike[str]) -> list[str]:
    """The array names of an ``.npz`` (for messages), or ``[]`` when it cannot be read."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return [n[: -len(".npy")] for n in z.namelist() if n.endswith(".npy")]
    except (OSError, zipfile.BadZipFile, ValueError):
        return []


def step_noise_fn(draws: Sequence[Any] | None, rng: np.random.Generator) -> Callable[[tuple[int, ...]], np.ndarray]:
    """The noise a stochastic sampler draws while stepping (``sampling``'s ``generator_noise``):
    the arrays ``draws`` in order (what diffusers' generator drew: ``--step-noise``), else standard
    normal float32 from ``rng``."""
    pending = list(draws) if draws is not None else None

    def draw(shape: tuple[int, ...]) -> np.ndarray:
        if pending is None:
            return rng.standard_normal(shape).astype(np.float32)
        if not pending:
            raise BundleError(f"--step-noise ran out: the sampler draws more than the {len(draws or ())} arrays given")
        a = np.asarray(pending.pop(0))
        if tuple(a.shape) != tuple(shape):
            raise BundleError(f"--step-noise draw {len(draws or ()) - len(pending)} is {list(a.shape)}; the "
                              f"sampler draws {list(shape)}")
        if a.dtype.kind != "f" or not np.isfinite(a).all():
            raise BundleError(f"--step-noise draw {len(draws or ()) - len(pending)} is not finite float noise")
        return a.astype(np.float32)

    return draw


def load_step_noise(path: str | os.PathLike[str]) -> list[np.ndarray]:
    """``--step-noise FILE.npz``: the sampler's draws in order, keyed ``0``, ``1``, ... ."""
    arrays = load_npz(path, "--step-noise")
    bad = [k for k in arrays if not k.isdigit()]
    if bad or sorted(int(k) for k in arrays) != list(range(len(arrays))):
        raise BundleError(f"--step-noise {path}: its arrays must be named 0, 1, ... in draw order, got "
                          f"{', '.join(sorted(arrays)[:5]) or 'none'}")
    return [arrays[str(i)] for i in range(len(arrays))]


def png_bytes(image: np.ndarray) -> bytes:
    """An 8-bit PNG of ``image`` (HWC uint8, 1, 3 or 4 channels), with zlib from the standard library:
    no image library on the board.  The same pixels give the same bytes."""
    import struct
    import zlib

    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] not in (1, 3, 4):
        raise BundleError(f"a PNG holds HWC uint8 with 1, 3 or 4 channels, not {image.dtype} {list(image.shape)}")
    h, w, c = image.shape
    color = {1: 0, 3: 2, 4: 6}[c]
    rows = np.ascontiguousarray(image).reshape(h, w * c)
    raw = np.concatenate([np.zeros((h, 1), np.uint8), rows], axis=1).tobytes()  # filter 0 on every row

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def image_pixels(image: np.ndarray) -> list[np.ndarray]:
    """The 8-bit pixels of each image of a decoder output, as diffusers' ``numpy_to_pil`` makes them
    (``round(x * 255)``): HWC for an image (NCHW in [0, 1]), FHWC for a video's frames (NCFHW: what
    ``output_type="np"`` returns as ``frames``, axes moved)."""
    a = np.asarray(image, dtype=np.float32)
    if a.ndim not in (4, 5):
        raise BundleError(f"the decoder gave an image of shape {list(a.shape)}, not NCHW or NCFHW")
    if not np.isfinite(a).all():
        raise BundleError("the decoded image holds NaN/Inf values")
    return [np.round(np.clip(np.moveaxis(x, 0, -1), 0.0, 1.0) * 255.0).astype(np.uint8) for x in a]


def image_files(path: Path, pixels: Sequence[np.ndarray]) -> list[tuple[Path, np.ndarray]]:
    """Where ``--image-out PATH`` puts each picture of :func:`image_pixels`: ``PATH`` for one image,
    ``<stem>-<i><suffix>`` for several; a video's frames one PNG each, ``<stem>-f<frame><suffix>``
    (``<stem>-<i>-f<frame><suffix>`` for several videos; :data:`FRAME_NAME`), even for one frame: a
    video's file names do not change with its frame count."""
    out: list[tuple[Path, np.ndarray]] = []
    for i, px in enumerate(pixels):
        stem = path.stem if len(pixels) == 1 else f"{path.stem}-{i}"
        if px.ndim == 4:
            out += [(path.with_name(FRAME_NAME.format(stem=stem, frame=k, suffix=path.suffix)), f)
                    for k, f in enumerate(px)]
        else:
            out.append((path.with_name(f"{stem}{path.suffix}"), px))
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


def _check_npy_header(f: IO[bytes], where: str, size: int) -> None:
    """Read a ``.npy`` header from ``f`` (``size`` bytes in all): an object or structured dtype, or a
    shape needing more bytes than there are (a 2^40-element header on a few bytes), is refused
    before anything is allocated."""
    fmt = np.lib.format
    version = fmt.read_magic(f)
    shape, _fortran, dtype = (fmt.read_array_header_1_0(f) if version == (1, 0)
                              else fmt.read_array_header_2_0(f))
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in "biuf":
        raise BundleError(f"{where} has dtype {dtype}, not a numeric one")
    n = 1
    for d in shape:
        n *= int(d)
    if n > MAX_TENSOR_ELEMENTS or n * dtype.itemsize > size:
        raise BundleError(f"{where} claims shape {tuple(shape)}, more than its {size} bytes hold")


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
                    _check_npy_header(f, f"{what} {p}: array {k!r}", info.file_size)
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


def png_written_here(path: Path) -> bool:
    """A PNG (``--image-out``: :func:`png_bytes` writes nothing else there)."""
    return _head(path, 8) == b"\x89PNG\r\n\x1a\n"


#: every output flag of the runner and how it knows a file it wrote there (``--force`` replaces
#: only such a file); each goes through :func:`check_save_target`
OUTPUT_FLAGS: dict[str, Callable[[Path], bool]] = {"--save-outputs": npz_written_here, "--latent-out": npy_written_here,
                                                   "--image-out": png_written_here}


def check_save_target(path: str, flag: str = "--save-outputs", *, force: bool = False, bundle: Path | None = None,
                      inputs: Sequence[str | os.PathLike[str] | None] = (),
                      owned: Callable[[Path], bool] | None = None, default: bool = False) -> Path:
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
            how = (f"run it from outside the bundle folder, or pass {flag} PATH" if default
                   else "choose a path outside it")
            raise BundleError(f"{flag} {p}{' (the default, in the current folder)' if default else ''} lies inside the "
                              f"bundle {bundle}; the runner never writes over the bundle it runs: {how}")
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


def bundle_summary(folder: Path) -> str:
    """What the bundle in ``folder`` carries (``--help``'s epilog): its pipeline, sampler and VAE
    decoder, from its manifest; "" when there is no readable manifest there."""
    try:
        m = read_manifest(folder)
    except (BundleError, OSError, ValueError):
        return ""
    d: JsonObject = m["denoise"] if isinstance(m.get("denoise"), dict) else {}
    p = d.get("pipeline") if isinstance(d.get("pipeline"), dict) else None
    plan = m.get("plan") or {}
    lines = [f"This bundle: {plan.get('npu_stages', '?')} NPU + {plan.get('host_stages', '?')} host stages, toolkit "
             f"{m.get('toolkit')}, target {m.get('target')}."]
    if p is not None:
        smp = p.get("sampler") or {}
        sched = " ".join(x for x in (str(smp.get("rule") or ""), f"mu {smp['mu']:g}" if isinstance(
            smp.get("mu"), (int, float)) else "") if x)
        lines.append(f"Pipeline: {p.get('class')} ({p.get('transformer') or 'transformer'}); sampler "
                     f"{smp.get('class')}{f' ({sched})' if sched else ''}; guidance {d.get('cfg_mode')} "
                     f"{p.get('guidance_scale')}; call arguments for --embeds: "
                     + (", ".join(sorted({a for e in (p.get("embeds") or {}).values()
                                          for a in (e.get("argument"), e.get("negative_argument")) if a})) or "none")
                     + f"; --latents {p.get('latent', {}).get('shape')}.")
    elif "error" in d or not d:
        lines.append("No denoising loop (" + str(d.get("error") or "no denoise record") + ").")
    else:
        lines.append("Loop: rkpart drift's flow-matching Euler (no pipeline description).")
    v = m.get("vae")
    if isinstance(v, dict):
        n_npu = sum(1 for s in v.get("stages", []) if s.get("device") == "npu")
        where = f"on the NPU ({n_npu} stage{'s' if n_npu != 1 else ''})" if v.get("device") == "npu" else \
            "on the host CPU (ONNX Runtime)"
        frames = p.get("num_frames") if p is not None else None
        lines.append(f"VAE decoder: {v.get('class') or 'vae_decoder.onnx'} {where}; --image-out writes "
                     + (f"a PNG per frame ({frames} frame{'s' if frames != 1 else ''}: <stem>-f0000.png, ...)."
                        if frames is not None
                        else "a PNG."))
    elif p is not None:
        lines.append("VAE decoder: none (rkpart bundle --vae none, or no vae_decoder.onnx); the loop ends at "
                     "--latent-out.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    ap = _Parser(
        prog="runner.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run an rkpart bundle and gate it against reference outputs, or (--steps) run a whole denoising "
                    "loop: the pipeline's own sampler (a bundle made from `rkpart export`'s pipeline.json) or "
                    "rkpart drift's flow-matching Euler, then decode the final latent to a PNG with the bundle's "
                    "VAE decoder.",
        epilog=bundle_summary(here) if (here / MANIFEST).is_file() else None)
    ap.add_argument("--bundle", default=str(here),
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
    ap.add_argument("--force", action="store_true", help="replace an output file (--save-outputs, --latent-out, "
                    "--image-out) the runner wrote before")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    loop = ap.add_argument_group("denoising loop (the manifest names the inputs and, from pipeline.json, the sampler)")
    loop.add_argument("--steps", type=int, default=None, help="run a denoising loop of this many steps: the call's "
                      "num_inference_steps (instead of gating one pass)")
    loop.add_argument("--guidance", type=float, default=None, help="the call's guidance_scale: the CFG scale (no "
                      "unconditional pass at <= 1), or the value fed to a guidance-distilled model [default: the "
                      "pipeline's, else the manifest's, 4.0]")
    loop.add_argument("--no-cfg", action="store_true", help="conditional pass only (no CFG)")
    loop.add_argument("--scheduler", choices=SCHEDULERS, default=None,
                      help="pipeline: the pipeline's own scheduler (pipeline.json); flow-euler: rkpart drift's "
                           "flow-matching Euler, sigma 1 -> 0 [default: pipeline when the bundle has one]")
    loop.add_argument("--embeds", default=None, help=".npz of the conditioning, keyed by the diffusers call "
                      "arguments (prompt_embeds, negative_prompt_embeds, pooled_prompt_embeds, prompt_attention_mask, "
                      "...: what `rkpart encode` writes) [default: drawn from --seed, no prompt]")
    loop.add_argument("--latents", default=None, help=".npy of the initial noise, as the pipeline's latents= "
                      "argument takes it [default: drawn from --seed]")
    loop.add_argument("--step-noise", default=None, help=".npz of the noise a stochastic sampler (DDPM, ancestral, "
                      "SDE) draws while stepping, arrays 0, 1, ... in draw order (a reproducibility aid: what "
                      "diffusers' generator drew) [default: drawn from --seed]")
    loop.add_argument("--shift", type=float, default=None, help="flow-euler: sigma shift shift*s/(1+(shift-1)*s) "
                      "[default: the manifest's, 1.0]")
    loop.add_argument("--seed", type=int, default=0, help="seed of the initial latent (and of the drawn "
                      "conditioning and step noise when not given) [default: 0]")
    loop.add_argument("--cond", default=None, help="flow-euler: .npz of the conditioning inputs by input name "
                      "[default: drawn from --seed]")
    loop.add_argument("--uncond", default=None, help="flow-euler: .npz of the unconditional pass's conditioning "
                      "[default: zeros]")
    loop.add_argument("--cfg-parallel", action="store_true", default=None,
                      help="run the cond and uncond pass of each step at once: two contexts of every NPU stage, "
                           "on NPU cores 0 and 1, in two threads (twice the device memory) [default: the manifest's]")
    loop.add_argument("--no-cfg-parallel", action="store_false", dest="cfg_parallel", help="one pass at a time")
    loop.add_argument("--latent-out", default=None, help="write the final latent here, as "
                      "pipe(..., output_type='latent') returns it [default: latent.npy]")
    loop.add_argument("--image-out", default=None, help="decode the final latent with the bundle's VAE decoder and "
                      "write this PNG (several images: <stem>-<i>.png; a video: one PNG per frame, "
                      "<stem>-f0000.png, ...) [default: image.png when the bundle has a VAE decoder]")
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



def load_npy(path: str | os.PathLike[str], what: str) -> np.ndarray:
    """A ``.npy`` file (``--latents``): a regular file whose header names a numeric dtype and a shape
    its bytes hold, read without pickle."""
    p = Path(path)
    if not os.path.lexists(p):
        raise BundleError(f"{what} file {p} does not exist")
    fmt = np.lib.format
    try:
        with open_regular(p, f"{what} file") as f:  # non-blocking, checked again through the descriptor
            _check_npy_header(f, f"{what} {p}", os.fstat(f.fileno()).st_size)
            f.seek(0)
            return np.asarray(fmt.read_array(f, allow_pickle=False))
    except BundleError:
        raise
    except (OSError, ValueError, EOFError) as e:
        raise BundleError(f"cannot read {what} {p}: not a usable .npy ({str(e).splitlines()[0] if str(e) else e!r})"
                          ) from None


def image_targets(path: str, pixels: Sequence[np.ndarray], *, force: bool = False, bundle: Path | None = None,
                  inputs: Sequence[str | os.PathLike[str] | None] = ()) -> list[tuple[Path, np.ndarray]]:
    """Where ``--image-out`` writes the pictures ``pixels`` (:func:`image_files`), every file through
    :func:`check_save_target` (the runner's output rule), before any is written."""
    first = check_save_target(path, "--image-out", force=force, bundle=bundle, inputs=inputs, owned=png_written_here)
    return [(first if f == first else check_save_target(str(f), "--image-out", force=force, bundle=bundle,
                                                        inputs=inputs, owned=png_written_here), px)
            for f, px in image_files(first, pixels)]


def _denoise_main(args: argparse.Namespace) -> int:
    check_numbers(args)
    folder = Path(args.bundle)
    run_inputs = (args.cond, args.uncond, args.embeds, args.latents, args.step_noise)
    out = check_save_target(args.latent_out or "latent.npy", "--latent-out", force=args.force, bundle=folder,
                            inputs=run_inputs, default=args.latent_out is None)
    m = read_manifest(folder)
    cfg_parallel = bool((m.get("denoise") or {}).get("cfg_parallel")) if args.cfg_parallel is None \
        else args.cfg_parallel
    runner = Runner(folder, residency=args.residency, core_mask=args.core_mask, verify=not args.no_verify,
                    cfg_parallel=cfg_parallel)
    runner.loop  # noqa: B018 - refuses a bundle without a denoise record before any work
    scheduler = args.scheduler or runner.default_scheduler()
    pipeline = scheduler == "pipeline"
    if not pipeline and (args.embeds or args.latents or args.step_noise):
        raise BundleError("--embeds / --latents / --step-noise drive the pipeline's sampler; "
                          + ("this bundle has no pipeline description" if runner.pipeline is None
                             else "drop --scheduler flow-euler"))
    if pipeline and (args.cond or args.uncond or args.shift is not None):
        raise BundleError("--cond / --uncond / --shift belong to the flow-euler loop; the pipeline's sampler takes "
                          "--embeds (its call arguments) and its own schedule")
    image_out = args.image_out if args.image_out is not None else ("image.png" if runner.has_vae else None)
    # the output rule first, as for --latent-out; the latent is written first: an image path that is
    # the latent's would replace it
    image_inputs = (*run_inputs, out)
    image_to = None if image_out is None else check_save_target(image_out, "--image-out", force=args.force,
                                                                bundle=folder, inputs=image_inputs,
                                                                owned=png_written_here,
                                                                default=args.image_out is None)
    if args.image_out is not None and not runner.has_vae:
        raise BundleError("--image-out needs the VAE decoder in the bundle (rkpart bundle --vae npu|host of a plan "
                          "with a pipeline.json); this one ends at the latent")
    check_device_budget(runner)
    if runner.npu_standin is not None:
        print(f"runner: NPU stages run on an ONNX Runtime stand-in ({STANDIN_ENV}="
              f"{STANDIN_SEP.join(str(p) for p in runner.npu_standins or ())}), not on the NPU", file=sys.stderr)
    cond = load_npz(args.cond, "cond") if args.cond else None
    uncond = load_npz(args.uncond, "uncond") if args.uncond else None
    embeds = latents = noise = None
    if pipeline:
        g = runner.pipeline_guidance(args.guidance)
        if args.embeds:
            embeds = load_npz(args.embeds, "--embeds")  # checked here, before any work; mapped in the loop
            runner.embeds_inputs(embeds, uncond=runner.do_cfg(g, not args.no_cfg), what=f"--embeds {args.embeds}",
                                 keys=", ".join(sorted(embeds)) or "none")
        else:
            print("runner: no --embeds: the conditioning is drawn from --seed (no prompt; rkpart encode writes one)",
                  file=sys.stderr)
        if args.latents:
            latents = runner.initial_latent(load_npy(args.latents, "--latents"), np.random.default_rng(0))
        noise = load_step_noise(args.step_noise) if args.step_noise else None
        passes = runner.calls_per_step(args.guidance, not args.no_cfg)
        cfg_mode = str(runner.loop.get("cfg_mode", "two-pass"))
        mode = {"batched": "one call on the uncond/cond pair" if runner.do_cfg(g, not args.no_cfg)
                else "one call (no CFG)", "distilled": "one pass, distilled guidance",
                "none": "one pass"}.get(cfg_mode) or ("one pass" if passes == 1 else (
                    "cond and uncond in parallel (cores 0 and 1)" if cfg_parallel else "cond then uncond"))
    else:
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
                           scheduler=scheduler, cond=cond, uncond=uncond, cfg=not args.no_cfg, on_step=on_step,
                           call=CallInputs(embeds, latents, noise))
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
    images: list[str] = []
    decode: dict[str, float] | None = None
    if image_to is not None:
        t0 = time.perf_counter()
        try:
            pixels = image_pixels(runner.decode(x))
        except BundleError as e:
            print(f"runner: error: {e}; no image written (the latent is in {out})", file=sys.stderr)
            return EXIT_GATE if "NaN" in str(e) else e.exit_code
        vae = runner.vae_runner()
        decode = summed(vae.open_timings + vae.timings + vae.close_timings, time.perf_counter() - t0)
        for target, px in image_targets(str(image_to), pixels, force=args.force, bundle=folder, inputs=image_inputs):
            data = png_bytes(px)
            save_atomic(target, lambda f, data=data: f.write(data), "--image-out")  # type: ignore[misc]
            images.append(str(target))
        total += decode["wall_s"]
    report = {"bundle": str(folder), "steps": args.steps, "passes_per_step": passes, "cfg_parallel": cfg_parallel,
              "seed": args.seed, "scheduler": scheduler, "latent": str(out), "latent_shape": list(x.shape),
              "latent_dtype": str(x.dtype), "open_close": setup, "per_step": runner.step_timings, "total_s": total,
              "npu_standin": str(runner.npu_standin) if runner.npu_standin else None,
              "core_masks": {s["id"]: runner.stage_core_mask(s) for s in runner.stages if s["device"] == "npu"},
              "images": images, "decode": decode,
              **({"pipeline": (runner.pipeline or {}).get("class"),
                  "sampler": (runner.pipeline or {}).get("sampler", {}).get("class"),
                  "guidance": runner.pipeline_guidance(args.guidance)} if pipeline else {})}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"open+close: {setup['wall_s']:.3f} s (load {setup['load_s']:.3f}, init {setup['init_s']:.3f}, "
              f"release {setup['release_s']:.3f})")
        if decode is not None:
            print(f"decode: {decode['wall_s']:.3f} s (load {decode['load_s']:.3f}, init {decode['init_s']:.3f}, "
                  f"infer {decode['infer_s']:.3f}, release {decode['release_s']:.3f})")
        print(f"latent: {out} {x.dtype} {tuple(x.shape)}; {args.steps} steps in {total:.3f} s")
        for img in images:
            print(f"image: {img}")
    return 0


def device_need(runner: Runner) -> tuple[int, int] | None:
    """Device bytes the run holds at most (resident stages + the largest per-stage one; twice that
    under ``cfg_parallel``) and the manifest's budget; ``None`` when the manifest has no figures."""
    dm = runner.manifest.get("device_memory")
    if not isinstance(dm, dict) or "budget_bytes" not in dm:
        return None
    def held(r: Runner) -> int:
        per = {s["id"]: int(s.get("device_bytes") or 0) for s in r.stages if s["device"] == "npu"}
        resident = sum(b for sid, b in per.items() if r.residency[sid] == "resident")
        return resident + max((b for sid, b in per.items() if r.residency[sid] != "resident"), default=0)

    loop = held(runner) * (2 if runner.cfg_parallel else 1)
    # the decoder runs once the loop's runner is closed (its resident stages released)
    decode = held(runner.vae_runner()) if runner.has_vae else 0
    return max(loop, decode), int(dm["budget_bytes"])


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
