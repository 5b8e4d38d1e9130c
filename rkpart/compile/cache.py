"""Content-addressed store of built ``.rknn`` files.

The key of a build is the sha256 of everything that determines its output: the stage's ONNX
bytes, the bytes of its external-data files, the toolkit version, the target and the
normalised build config.  Renaming a folder, touching a file's mtime or reordering config
options does not change it; editing a weight does.

Layout, both in a plan folder (``<plan>/rknn/``) and in an optional shared cache dir::

    objects/<key>.rknn     the model
    objects/<key>.json     how it was built: toolkit, target, config, cpu_ops, size, sha256,
                           wall time, peak RSS, build log
    objects/<key>.fail.json  a deterministic failure (crash / toolkit error) of that key, so
                           a rerun does not crash again; timeouts and OOM are not recorded
                           because they depend on the machine
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from rkpart.errors import UserError
from rkpart.io import atomic_write_bytes, atomic_writer, external_locations, file_sha256, hash_file
from rkpart.plan.weights import LINK_DIR
from rkpart.readers import FileKind
from rkpart.types import BuildFailure, JsonMap, JsonObject

CACHE_VERSION = 1
#: metadata and failure records are small; a bigger one is not ours
MAX_ENTRY_BYTES = 4 << 20
OBJECTS = "objects"

#: RKNN.config defaults; options equal to them are dropped so that spelling out a default
#: (``--opt-level 3``) hits the same cache entry as leaving it out.
CONFIG_DEFAULTS: JsonObject = {
    "optimization_level": 3,
    "single_core_mode": False,
    "float_dtype": "float16",
    "mean_values": None,
    "std_values": None,
    "custom_string": None,
    "op_target": None,
    "compress_weight": False,
    "remove_weight": False,
    "enable_flash_attention": False,
    "sparse_infer": False,
    "remove_reshape": False,
    "model_pruning": False,
    "dynamic_input": None,
}


def normalise_config(config: JsonMap) -> JsonObject:
    """Build options without the target and without values equal to the toolkit defaults, sorted."""
    out = {}
    for k in sorted(config):
        if k == "target_platform":
            continue
        v = config[k]
        if k in CONFIG_DEFAULTS and CONFIG_DEFAULTS[k] == v and type(CONFIG_DEFAULTS[k]) is type(v):
            continue
        out[k] = v
    return out


def config_hash(config: JsonMap) -> str:
    """Short hash of the normalised config (recorded in artifacts)."""
    blob = json.dumps(normalise_config(config), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def external_data_files(onnx_path: Path) -> list[Path]:
    """External-data files an ONNX model refers to, sorted and unique."""
    return [onnx_path.parent / loc for loc in external_locations(onnx_path, what="stage")]


def measured_stage_bytes(onnx_path: Path) -> int:
    """Bytes of a stage on disk: its ONNX file plus its external-data files (what the toolkit
    loads; the memory model's size figure)."""
    return sum(p.stat().st_size for p in [onnx_path, *external_data_files(onnx_path)])


def build_key(onnx_path: Path, toolkit_version: str, target: str, config: JsonMap,
              extra: JsonMap | None = None) -> str:
    """The cache key of building ``onnx_path`` (sha256 hex).

    ``extra``: what else decides the build (a quantized stage's precision and calibration
    digest, :meth:`rkpart.compile.precision.StagePrecision.key_extra`); empty keeps the key
    of an fp16 build as it always was."""
    h = hashlib.sha256()
    h.update(f"rkpart-rknn-cache-v{CACHE_VERSION}\0".encode())
    own = onnx_path.name + ".data"
    h.update(_position_free(onnx_path, own))
    for ext in external_data_files(onnx_path):
        if ext.name != own and ext.relative_to(onnx_path.parent).parts[0] == LINK_DIR:
            # a --weights link plan's shared file: only the slices this stage reads (its .onnx,
            # hashed above, names them), not the whole model's weights for every stage
            _hash_slices(h, onnx_path, ext)
            continue
        # Name and length first, so that moving bytes from one file to another changes the key.
        name = "<stage>.data" if ext.name == own else ext.name
        h.update(f"\0ext:{name}:{ext.stat().st_size}\0".encode())
        hash_file(h, ext)
    meta = {"toolkit": toolkit_version, "target": target, "config": normalise_config(config)}
    if extra:
        meta["quantization"] = dict(extra)
    h.update(b"\0" + json.dumps(meta, sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()


def _position_free(onnx_path: Path, own: str) -> bytes:
    """The ``.onnx`` bytes with the name of its own data file replaced by a fixed token.

    A stage's file name carries its position in the plan (``003_b00.xattn.onnx``), and so does
    the location its weights are read from; a stage that moved (another stage was cut in two
    before it, ``rkpart compile --repartition``) is the same build.  Its weights' bytes are
    hashed below, under a position-free name too.
    """
    data = onnx_path.read_bytes()
    if own.encode() not in data:
        return data
    import onnx

    model = onnx.ModelProto()
    model.ParseFromString(data)
    for t in model.graph.initializer:
        for e in t.external_data:
            if e.key == "location" and e.value == own:
                e.value = "<stage>.data"
    return model.SerializeToString(deterministic=True)


def _hash_slices(h: Any, onnx_path: Path, ext: Path) -> None:
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    rel = ext.relative_to(onnx_path.parent).as_posix()
    with open(ext, "rb") as f:
        for t in model.graph.initializer:
            info = {e.key: e.value for e in t.external_data}
            if t.data_location != onnx.TensorProto.EXTERNAL or info.get("location") != rel:
                continue
            offset, length = int(info.get("offset", 0) or 0), int(info.get("length", 0) or 0)
            h.update(f"\0slice:{t.name}:{offset}:{length}\0".encode())
            f.seek(offset)
            left = length
            while left:
                buf = f.read(min(left, 1 << 22))
                if not buf:
                    break
                h.update(buf)
                left -= len(buf)


class ArtifactCache:
    """One cache directory (a plan's ``rknn/`` or a shared one)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.objects = root / OBJECTS

    def rknn_path(self, key: str) -> Path:
        return self.objects / f"{key}.rknn"

    def meta_path(self, key: str) -> Path:
        return self.objects / f"{key}.json"

    def fail_path(self, key: str) -> Path:
        return self.objects / f"{key}.fail.json"

    def get(self, key: str) -> JsonObject | None:
        """The metadata of a complete entry whose .rknn still has its recorded sha256, else None.

        A corrupted or replaced object (even of the same size) is a miss: it is rebuilt.
        """
        try:
            meta = _load_small_json(self.meta_path(key))
            rknn = self.rknn_path(key)
            if not isinstance(meta, dict) or os.path.islink(rknn) or not rknn.is_file():
                return None
            if rknn.stat().st_size != int(meta["size_bytes"]) or file_sha256(rknn) != str(meta["sha256"]):
                return None
            return dict(meta)
        except (OSError, ValueError, KeyError, TypeError, UserError):
            return None

    def get_failure(self, key: str) -> BuildFailure | None:
        """A remembered deterministic failure (crash, toolkit error) of ``key``, else None."""
        try:
            fail = BuildFailure.from_json(_load_small_json(self.fail_path(key)))
        except (OSError, ValueError, TypeError, AttributeError, UserError):
            return None
        return fail if fail.deterministic else None

    def put_meta(self, key: str, meta: JsonMap) -> None:
        """Record metadata last: an entry exists only once both files are complete."""
        atomic_write_bytes(self.meta_path(key), _dumps(meta))
        with contextlib.suppress(OSError):
            self.fail_path(key).unlink()

    def put_failure(self, key: str, failure: BuildFailure) -> None:
        atomic_write_bytes(self.fail_path(key), _dumps(failure.to_json()))

    def import_from(self, other: ArtifactCache, key: str) -> JsonObject | None:
        """Copy (hard-link when possible) ``key`` from ``other``; returns its metadata or None."""
        meta = other.get(key)
        if meta is None:
            return None
        dst = self.rknn_path(key)
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.{os.getpid()}.link")
        try:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            os.link(other.rknn_path(key), tmp)
            os.replace(tmp, dst)
        except OSError:
            with atomic_writer(dst) as t:
                shutil.copyfile(other.rknn_path(key), t)
        self.put_meta(key, meta)
        return meta

    def export_to(self, other: ArtifactCache, key: str) -> None:
        """Publish ``key`` into ``other`` (the shared cache); failures to do so are not fatal."""
        with contextlib.suppress(OSError):
            other.import_from(self, key)


#: a build cache entry's metadata or remembered failure (``objects/<key>.json``, ``.fail.json``), in a
#: plan's ``rknn/`` or a shared cache; one that cannot be read is a miss, rebuilt
ENTRY_KIND = FileKind("cache entry", "json", MAX_ENTRY_BYTES, UserError, symlinks=False,
                      doc="`objects/<key>.json` of a plan's `rknn/` or a build cache (unreadable: a miss, rebuilt)")


def _load_small_json(path: Path) -> Any:
    return ENTRY_KIND.load(path, root=path.parent)


def _dumps(d: JsonMap) -> bytes:
    return (json.dumps(dict(d), indent=2, sort_keys=True) + "\n").encode()
