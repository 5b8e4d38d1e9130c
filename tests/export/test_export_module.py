"""``rkpart.export.export_module`` on real diffusers models (tiny, seeded) and real exporters.

Each export is checked by the product against the unpatched torch model under ONNX Runtime; the
tests check it again on their own (a second mask, the external data file, float16 types) so that a
check that passed vacuously would fail here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rkpart.errors import ExportError
from tests.models.diffusers_families import missing_dependencies

pytestmark = [pytest.mark.export, pytest.mark.slow,
              pytest.mark.skipif(bool(missing_dependencies()), reason=f"not installed: {missing_dependencies()}")]


def _family(name: str, **extra: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Family ``name`` as the sweep builds it (seed 0, fixture prepare), ``extra`` inputs added."""
    from tests.models.diffusers_families import _prepared

    model, inputs, fixed = _prepared(name, 0)
    return model, {**inputs, **extra}, fixed


def _mask(length: int, valid: int) -> Any:
    import torch

    return (torch.arange(length) < valid).to(torch.int64).unsqueeze(0)


def _torch_out(name: str, inputs: dict[str, Any], **extra: Any) -> np.ndarray:
    """The unpatched model's output (a fresh build with the same seed) on ``inputs``."""
    import torch

    model, _, fixed = _family(name)
    with torch.no_grad():
        return model(**inputs, **extra, **fixed, return_dict=False)[0].numpy()


def _ort(path: Path, feeds: dict[str, Any]) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: np.asarray(feeds[i.name]) for i in sess.get_inputs()})[0]


#: (family, mask input, exporter): families whose forward takes a text attention mask.  Lumina2 derives caption
#: lengths from it in Python (its registry patch computes them in the graph); PixArt and Sana take the
#: pipeline's prompt_attention_mask, which the sweep's configs leave out (added here); HunyuanDiT has two
MASKED = [
    ("lumina2", "encoder_attention_mask", "torchscript"),
    ("lumina2", "encoder_attention_mask", "dynamo"),
    ("pixart", "encoder_attention_mask", "torchscript"),
    ("sana", "encoder_attention_mask", "dynamo"),
    ("hunyuandit", "text_embedding_mask", "torchscript"),
]


@pytest.mark.parametrize(("family", "mask", "exporter"), MASKED, ids=[f"{f}-{e[:2]}" for f, _, e in MASKED])
def test_masks_are_graph_inputs(family: str, mask: str, exporter: str, tmp_path: Path) -> None:
    """The export agrees with torch for an all-valid mask and a shorter valid prefix (the product checks
    both; checked again here against a fresh, unpatched model), and the two masks give different outputs.

    Lumina2's exports are the family sweep's (the cache: made by export_module, without its ONNX Runtime
    check); the others are made here with the check on."""
    from rkpart.export import export_module
    from tests.models.diffusers_families import cached_export

    model, inputs, fixed = _family(family, **{mask: _mask(6, 6)})
    if family == "lumina2":  # a family of the sweep whose mask is in its config
        path = cached_export(family, exporter)
    else:
        res = export_module(model, inputs, tmp_path / "t.onnx", fixed=fixed, exporter=exporter)
        assert mask in res.inputs and res.check is not None and res.check.input_sets == 2
        assert res.external_data is None and [p.name for p in tmp_path.iterdir()] == ["t.onnx"]
        path = res.path
    feeds = {k: v.numpy() for k, v in inputs.items()}
    outs = []
    for valid in (6, 2):
        m = _mask(6, valid)
        ref = _torch_out(family, {**inputs, mask: m})
        got = _ort(path, {**feeds, mask: m.numpy()})
        np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4 * float(np.abs(ref).max()))
        outs.append(got)
    assert np.abs(outs[0] - outs[1]).max() > 1e-3 * np.abs(outs[0]).max(), "the mask changes nothing: vacuous"


def test_a_mask_baked_in_at_trace_time_is_refused(tmp_path: Path) -> None:
    """A forward that turns the mask into a Python number (TorchScript traces it as a constant) exports,
    but the check with a second mask finds the difference: one line naming the mask, nothing written."""
    import torch

    from rkpart.export import export_module

    class Baked(torch.nn.Module):
        def forward(self, hidden_states: torch.Tensor, encoder_attention_mask: torch.Tensor,
                    return_dict: bool = False) -> tuple[torch.Tensor]:
            n = int(encoder_attention_mask.sum())  # a Python int: a constant of the trace
            return (hidden_states[:, :n].mean(dim=1, keepdim=True) + hidden_states,)

    inputs = {"hidden_states": torch.randn(1, 6, 4), "encoder_attention_mask": _mask(6, 6)}
    with pytest.raises(ExportError) as e:
        export_module(Baked(), inputs, tmp_path / "t.onnx", exporter="torchscript")
    msg = str(e.value)
    assert e.value.exit_code == 11 and "\n" not in msg
    assert msg.startswith("the torchscript export of Baked differs from torch with encoder_attention_mask varied")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_large_weights_go_to_external_data(exporter: str, tmp_path: Path) -> None:
    """Weights over the threshold (lowered here from 1 GiB) go to one ``<name>.data`` beside the model,
    which ONNX Runtime runs from its final place (below it the model holds them: the other tests' exports)."""
    import onnx

    from rkpart.export import OnnxOptions, export_module

    model, inputs, fixed = _family("dit")
    res = export_module(model, inputs, tmp_path / "out" / "t.onnx", fixed=fixed, exporter=exporter,
                        options=OnnxOptions(external_data_threshold=4096))
    assert res.external_data == tmp_path / "out" / "t.onnx.data"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["t.onnx", "t.onnx.data"]
    proto = onnx.load(str(res.path), load_external_data=False)
    locations = {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"t.onnx.data"}
    assert res.path.stat().st_size < res.external_data.stat().st_size
    feeds = {k: v.numpy() for k, v in inputs.items()}
    np.testing.assert_allclose(_ort(res.path, feeds), _torch_out("dit", inputs), rtol=1e-4, atol=1e-5)


FP16 = [("dit", "dynamo"), ("flux", "torchscript"), ("lumina2", "torchscript"), ("sana", "torchscript")]


@pytest.mark.parametrize(("family", "exporter"), FP16, ids=[f"{f}-{e[:2]}" for f, e in FP16])
def test_float16(family: str, exporter: str, tmp_path: Path) -> None:
    """float16 exports: weights and floating inputs in half, checked against the float32 torch model."""
    import onnx
    from onnx import TensorProto

    from rkpart.export import CHECK_TOLERANCES, export_module

    model, inputs, fixed = _family(family)
    res = export_module(model, inputs, tmp_path / "t.onnx", fixed=fixed, exporter=exporter, dtype="float16")
    assert res.check is not None and res.check.cosine >= CHECK_TOLERANCES["float16"][0]
    proto = onnx.load(str(res.path))
    types = {i.name: i.type.tensor_type.elem_type for i in proto.graph.input}
    for k, v in inputs.items():
        if k in types:
            assert types[k] == (TensorProto.FLOAT16 if v.is_floating_point() else TensorProto.INT64), k
    big = [t for t in proto.graph.initializer if len(t.dims) == 2 and min(t.dims) >= 16]
    assert big and all(t.data_type == TensorProto.FLOAT16 for t in big)


def test_onnx_runtime_refusal_names_the_other_exporter(tmp_path: Path) -> None:
    """PixArt by dynamo: ORT refuses the export (a Squeeze of a dim of 16, tests/partitioner's ORT_REFUSES)."""
    from rkpart.export import export_module

    model, inputs, fixed = _family("pixart")
    with pytest.raises(ExportError, match=r"^ONNX Runtime cannot load the dynamo export of PixArtTransformer2DModel: "
                                          r".*; try --exporter torchscript$") as e:
        export_module(model, inputs, tmp_path / "t.onnx", fixed=fixed, exporter="dynamo")
    assert e.value.exit_code == 11 and list(tmp_path.iterdir()) == []


def test_exporter_failure_is_one_line(tmp_path: Path) -> None:
    """An op the exporter has no conversion for (``linalg_qr`` in TorchScript): its reason, the other exporter."""
    import torch

    from rkpart.export import export_module

    class QR(torch.nn.Module):
        def forward(self, hidden_states: torch.Tensor, return_dict: bool = False) -> tuple[torch.Tensor]:
            return (torch.linalg.qr(hidden_states)[0],)

    with pytest.raises(ExportError, match=r"^the torchscript exporter failed on QR: .*; try --exporter dynamo$") as e:
        export_module(QR(), {"hidden_states": torch.randn(4, 4)}, tmp_path / "t.onnx")
    assert "\n" not in str(e.value) and list(tmp_path.iterdir()) == []
