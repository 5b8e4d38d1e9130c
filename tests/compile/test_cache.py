"""Cache keys: content, toolkit, target and normalised config; nothing else."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rkpart.compile.cache import ArtifactCache, build_key, config_hash, normalise_config


def _model(path: Path, w: float, external: bool = False) -> None:
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
                          [numpy_helper.from_array(np.full((64, 64), w, np.float32), "w")])
    m = helper.make_model(g)
    if external:
        onnx.save(m, str(path), save_as_external_data=True, location=path.name + ".data", size_threshold=0)
    else:
        onnx.save(m, str(path))


def test_key_depends_on_bytes_not_on_mtime_or_location(tmp_path: Path) -> None:
    a = tmp_path / "a" / "s.onnx"
    a.parent.mkdir()
    _model(a, 1.0)
    k = build_key(a, "2.3.0", "rk3588", {})
    os.utime(a, (0, 0))
    b = tmp_path / "b.onnx"
    b.write_bytes(a.read_bytes())
    assert build_key(a, "2.3.0", "rk3588", {}) == k == build_key(b, "2.3.0", "rk3588", {})
    _model(a, 2.0)
    assert build_key(a, "2.3.0", "rk3588", {}) != k


def test_key_covers_external_data(tmp_path: Path) -> None:
    p = tmp_path / "s.onnx"
    _model(p, 1.0, external=True)
    k = build_key(p, "2.3.0", "rk3588", {})
    data = tmp_path / "s.onnx.data"
    data.write_bytes(np.full((64, 64), 3.0, np.float32).tobytes())  # same size, other weights
    assert build_key(p, "2.3.0", "rk3588", {}) != k


def test_key_covers_toolkit_target_and_config(tmp_path: Path) -> None:
    p = tmp_path / "s.onnx"
    _model(p, 1.0)
    base = build_key(p, "2.3.0", "rk3588", {})
    assert build_key(p, "2.5.0", "rk3588", {}) != base
    assert build_key(p, "2.3.0", "rk3576", {}) != base
    assert build_key(p, "2.3.0", "rk3588", {"single_core_mode": True}) != base
    # defaults spelt out, or options in another order, are the same build
    assert build_key(p, "2.3.0", "rk3588", {"optimization_level": 3, "single_core_mode": False}) == base
    a = {"optimization_level": 2, "single_core_mode": True}
    assert config_hash(a) == config_hash(dict(reversed(a.items())))
    assert normalise_config({"target_platform": "rk3588", "optimization_level": 3}) == {}


def test_entry_needs_metadata_and_matching_sha256(tmp_path: Path) -> None:
    import hashlib

    c = ArtifactCache(tmp_path / "rknn")
    c.objects.mkdir(parents=True)
    c.rknn_path("k").write_bytes(b"12345")
    assert c.get("k") is None  # no metadata yet: an interrupted build
    meta = {"size_bytes": 5, "toolkit": "2.3.0", "sha256": hashlib.sha256(b"12345").hexdigest()}
    c.put_meta("k", meta)
    assert c.get("k") == meta
    c.rknn_path("k").write_bytes(b"123")
    assert c.get("k") is None  # truncated file
    c.rknn_path("k").write_bytes(b"12346")
    assert c.get("k") is None  # corrupted, same size (issue 13)


def test_import_from_shared_cache(tmp_path: Path) -> None:
    shared, local = ArtifactCache(tmp_path / "shared"), ArtifactCache(tmp_path / "plan" / "rknn")
    shared.objects.mkdir(parents=True)
    shared.rknn_path("k").write_bytes(b"abc")
    import hashlib

    meta = {"size_bytes": 3, "sha256": hashlib.sha256(b"abc").hexdigest()}
    shared.put_meta("k", meta)
    assert local.import_from(shared, "k") == meta
    assert local.rknn_path("k").read_bytes() == b"abc"
