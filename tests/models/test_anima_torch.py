"""The Anima example models: ONNX builder vs torch module vs real exporters (needs torch)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.models import anima
from tests.models.anima import AnimaConfig, build_anima_onnx, weight_specs

torch = pytest.importorskip("torch")
at = pytest.importorskip("tests.models.anima_torch")

pytestmark = pytest.mark.export  # runs the torch module (the export extra)

EXAMPLE = Path(__file__).resolve().parents[2] / "rkpart" / "data" / "anima_tiny.onnx"
SHARED_SILU = "/transformer_blocks.0/norm1/activation/Mul_output_0"


def _run(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _consumers(model: onnx.ModelProto, tensor: str) -> list[str]:
    return [n.name for n in model.graph.node if tensor in n.input]


def _torch_out(cfg: AnimaConfig, feeds: dict[str, np.ndarray], seed: int = 0) -> np.ndarray:
    model = at.make_model(cfg, seed)
    with torch.no_grad():
        return model(*(torch.from_numpy(v) for v in feeds.values())).numpy()


# -- builder vs torch --------------------------------------------------------------------------


@pytest.mark.parametrize("decomposed", [False, True])
@pytest.mark.parametrize(
    "cfg",
    [AnimaConfig.tiny(), AnimaConfig.tiny(num_blocks=1, latent_frames=2, heads=2, context_len=7)],
    ids=["tiny", "video-2heads"],
)
def test_builder_computes_the_torch_function(tmp_path: Path, cfg: AnimaConfig, decomposed: bool) -> None:
    path = build_anima_onnx(cfg, tmp_path / "m.onnx", seed=3, decomposed_layernorm=decomposed)
    feeds = at.example_inputs(cfg, seed=1)
    np.testing.assert_allclose(_run(path, feeds), _torch_out(cfg, feeds, seed=3), rtol=1e-5, atol=2e-5)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert ("LayerNormalization" in ops) != decomposed


def test_builder_fp16_tracks_fp32_torch(tmp_path: Path) -> None:
    cfg = AnimaConfig.tiny(dtype="float16")
    path = build_anima_onnx(cfg, tmp_path / "m.onnx")
    feeds = at.example_inputs(cfg)
    out = _run(path, feeds)
    assert out.dtype == np.float16
    ref = _torch_out(cfg.replace(dtype="float32"), {k: v.astype(np.float32) for k, v in feeds.items()})
    cos = float(np.dot(out.ravel().astype(np.float64), ref.ravel()) /
                (np.linalg.norm(out.astype(np.float64)) * np.linalg.norm(ref)))
    assert cos > 0.9999
    assert np.isfinite(out).all()


def test_external_data_round_trips(tmp_path: Path) -> None:
    cfg = AnimaConfig.tiny()
    inline = build_anima_onnx(cfg, tmp_path / "inline.onnx", external_data=False)
    ext = build_anima_onnx(cfg, tmp_path / "ext" / "m.onnx", external_data=True)
    data = tmp_path / "ext" / "m.onnx.data"
    assert data.stat().st_size >= cfg.param_count() * 4
    assert ext.stat().st_size < 200_000  # graph only
    assert not (tmp_path / "inline.onnx.data").exists()

    proto = onnx.load(str(ext), load_external_data=False)
    for init in proto.graph.initializer:
        assert init.data_location == onnx.TensorProto.EXTERNAL, init.name
        info = {e.key: e.value for e in init.external_data}
        assert info["location"] == "m.onnx.data"
        assert int(info["offset"]) % 4096 == 0
    feeds = at.example_inputs(cfg)
    np.testing.assert_array_equal(_run(ext, feeds), _run(inline, feeds))
    loaded = onnx.load(str(ext))  # onnx resolves the side file too
    assert {i.name for i in loaded.graph.initializer} == {i.name for i in onnx.load(str(inline)).graph.initializer}


# -- naming: like a real TorchScript export ------------------------------------------------------


@pytest.fixture(scope="module")
def torchscript_tiny(tmp_path_factory: pytest.TempPathFactory) -> onnx.ModelProto:
    path = at.export_torchscript(AnimaConfig.tiny(), tmp_path_factory.mktemp("ts") / "m.onnx")
    return onnx.load(str(path))


def test_builder_compute_node_names_match_torchscript(tmp_path: Path, torchscript_tiny: onnx.ModelProto) -> None:
    built = onnx.load(str(build_anima_onnx(AnimaConfig.tiny(), tmp_path / "m.onnx")))
    compute = {"MatMul", "Softmax", "LayerNormalization", "Erf", "Sigmoid", "Sin", "Cos"}

    def names(m: onnx.ModelProto) -> set[str]:
        return {n.name for n in m.graph.node if n.op_type in compute}

    assert names(built) == names(torchscript_tiny)
    # The gated residual adds carry the same names: they are the block boundaries.
    for i in range(2):
        assert f"/transformer_blocks.{i}/Add_2" in {n.name for n in built.graph.node}
    assert "/transformer_blocks.1/attn1/to_q/MatMul" in {n.name for n in built.graph.node}
    assert "transformer_blocks.1.attn1.to_q.weight" in {i.name for i in built.graph.initializer}


def test_shared_silu_is_named_after_block_0_in_both(tmp_path: Path, torchscript_tiny: onnx.ModelProto) -> None:
    built = onnx.load(str(build_anima_onnx(AnimaConfig.tiny(), tmp_path / "m.onnx")))
    for model in (built, torchscript_tiny):
        users = _consumers(model, SHARED_SILU)
        assert "/transformer_blocks.1/norm3/linear_1/MatMul" in users
        assert "/norm_out/linear_1/MatMul" in users
        assert len(users) == 3 * 2 + 1


# -- real exporters ------------------------------------------------------------------------------


def test_torchscript_export_runs_and_matches(torchscript_tiny: onnx.ModelProto, tmp_path: Path) -> None:
    cfg = AnimaConfig.tiny()
    path = tmp_path / "ts.onnx"
    onnx.save(torchscript_tiny, str(path))
    feeds = at.example_inputs(cfg, seed=5)
    np.testing.assert_allclose(_run(path, feeds), _torch_out(cfg, feeds), rtol=1e-5, atol=2e-5)
    assert torchscript_tiny.opset_import[0].version == 17


@pytest.mark.slow
def test_dynamo_export_runs_and_matches(tmp_path: Path) -> None:
    pytest.importorskip("onnxscript")
    cfg = AnimaConfig.tiny(num_blocks=1)
    path = at.export_dynamo(cfg, tmp_path / "dyn.onnx")
    feeds = at.example_inputs(cfg, seed=2)
    np.testing.assert_allclose(_run(path, feeds), _torch_out(cfg, feeds), rtol=1e-5, atol=2e-5)
    assert [i.name for i in onnx.load(str(path)).graph.input] == list(at.INPUT_NAMES)


# -- the bundled example -------------------------------------------------------------------------


def test_bundled_example_interface_and_numerics() -> None:
    assert EXAMPLE.stat().st_size < 2 * 1024 * 1024
    model = onnx.load(str(EXAMPLE))

    def shape(vi: onnx.ValueInfoProto) -> list[int]:
        return [d.dim_value for d in vi.type.tensor_type.shape.dim]

    assert [(i.name, shape(i)) for i in model.graph.input] == [
        ("hidden_states", [1, 16, 1, 16, 16]), ("timestep", [1]), ("encoder_hidden_states", [1, 16, 64])]
    assert [(o.name, shape(o)) for o in model.graph.output] == [("sample", [1, 16, 1, 16, 16])]
    cfg = AnimaConfig.tiny()
    feeds = at.example_inputs(cfg, seed=9)
    np.testing.assert_allclose(_run(EXAMPLE, feeds), _torch_out(cfg, feeds), rtol=1e-5, atol=2e-5)


def test_bundled_example_is_reproducible(tmp_path: Path) -> None:
    fresh = at.export_torchscript(AnimaConfig.tiny(), tmp_path / "m.onnx", seed=0)
    assert fresh.read_bytes() == EXAMPLE.read_bytes(), "rerun scripts/make_example.py"


# -- config --------------------------------------------------------------------------------------


def test_param_count_matches_weights_and_torch() -> None:
    cfg = AnimaConfig.tiny()
    assert cfg.param_count() == sum(s.numel for s in weight_specs(cfg))
    assert cfg.param_count() == sum(p.numel() for p in at.AnimaTransformer(cfg).parameters())
    full = AnimaConfig.full()
    assert full.num_tokens == 1024 and full.head_dim == 128
    assert 1.9e9 < full.param_count() < 2.0e9
    assert AnimaConfig.full(resolution=1024).num_tokens == 4096
    assert math.isclose(anima.weight_bytes(full) / 1e9, 3.9, abs_tol=0.1)
