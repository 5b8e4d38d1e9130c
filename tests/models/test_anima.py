"""The Anima ONNX builder (tests/models/anima.py) on its own: valid, static, deterministic graphs.

Against the torch module and the real exporters: tests/models/test_anima_torch.py.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tests.models import anima
from tests.models.anima import AnimaConfig, build_anima_onnx


def _consumers(model: onnx.ModelProto, tensor: str) -> list[str]:
    return [n.name for n in model.graph.node if tensor in n.input]


# -- the builder's graph -------------------------------------------------------------------------


def test_builder_graph_is_valid_and_fully_static(tmp_path: Path) -> None:
    path = build_anima_onnx(AnimaConfig.tiny(dtype="float16"), tmp_path / "m.onnx")
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    known = {vi.name: vi for vi in [*inferred.graph.value_info, *inferred.graph.output]}
    produced = [o for n in model.graph.node for o in n.output]
    for name in produced:
        dims = known[name].type.tensor_type.shape.dim
        assert all(d.HasField("dim_value") for d in dims), name
    assert model.opset_import[0].version == 17


# -- determinism and external data ---------------------------------------------------------------


@pytest.mark.parametrize("external", [False, True])
def test_builder_is_byte_deterministic(tmp_path: Path, external: bool) -> None:
    cfg = AnimaConfig.tiny(dtype="float16")
    a = build_anima_onnx(cfg, tmp_path / "a" / "m.onnx", seed=7, external_data=external)
    b = build_anima_onnx(cfg, tmp_path / "b" / "m.onnx", seed=7, external_data=external)
    assert a.read_bytes() == b.read_bytes()
    if external:
        assert Path(f"{a}.data").read_bytes() == Path(f"{b}.data").read_bytes()
    c = build_anima_onnx(cfg, tmp_path / "c" / "m.onnx", seed=8, external_data=external)
    blob = (lambda p: Path(f"{p}.data")) if external else (lambda p: p)
    assert blob(a).read_bytes() != blob(c).read_bytes()


def test_external_data_auto_threshold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = AnimaConfig.tiny()
    build_anima_onnx(cfg, tmp_path / "small.onnx")
    assert not (tmp_path / "small.onnx.data").exists()
    monkeypatch.setattr(anima, "AUTO_EXTERNAL_BYTES", 1000)
    build_anima_onnx(cfg, tmp_path / "big.onnx")
    assert (tmp_path / "big.onnx.data").exists()


def test_rebuilding_inline_removes_stale_side_file(tmp_path: Path) -> None:
    cfg = AnimaConfig.tiny()
    path = tmp_path / "m.onnx"
    build_anima_onnx(cfg, path, external_data=True)
    build_anima_onnx(cfg, path, external_data=False)
    assert not (tmp_path / "m.onnx.data").exists()
    assert len(onnx.load(str(path)).graph.initializer) > 0


# -- shared tensors ------------------------------------------------------------------------------


def test_builder_shares_rope_and_temb_across_blocks(tmp_path: Path) -> None:
    cfg = AnimaConfig.tiny(num_blocks=3)
    built = onnx.load(str(build_anima_onnx(cfg, tmp_path / "m.onnx")))
    for table in ("/rope/Cos_output_0", "/rope/Sin_output_0"):
        blocks = {name.split("/")[1] for name in _consumers(built, table)}
        assert blocks == {f"transformer_blocks.{i}" for i in range(3)}
    temb = "/time_embed/t_embedder/linear_2/MatMul_output_0"
    assert len(_consumers(built, temb)) == 3 * 3 + 1


# -- config --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [dict(heads=5), dict(dtype="bfloat16"), dict(latent_height=15),
                                 dict(num_blocks=0), dict(hidden=40, heads=4)])
def test_config_rejects_invalid_sizes(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        AnimaConfig.tiny(**bad)
