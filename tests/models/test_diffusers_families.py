"""The family exports: Lumina2's real-form RoPE computes what diffusers' complex RoPE computes; every class is swept."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.diffusers_families import FAMILIES, cached_export, missing_dependencies

pytestmark = [pytest.mark.export,
              pytest.mark.skipif(bool(missing_dependencies()), reason=f"not installed: {missing_dependencies()}")]


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_lumina2_export_equals_the_unpatched_model(exporter: str) -> None:
    """Both exporters take the patched model; ORT on the export equals diffusers' own complex RoPE model."""
    import onnxruntime as ort
    import torch

    torch.manual_seed(0)  # the export's seed: same weights, same example inputs
    model, inputs = FAMILIES["lumina2"].build()
    with torch.no_grad():
        reference = model.eval()(**inputs, return_dict=False)[0].numpy()
    sess = ort.InferenceSession(str(cached_export("lumina2", exporter)), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {k: v.numpy() for k, v in inputs.items()})
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-5)


def test_every_transformer_class_is_swept_or_says_why() -> None:
    """Issue 28's sweep: each model class of ``diffusers.models.transformers`` has a family (with the class it
    builds) or a reason in ``NOT_EXPORTED``; a class a new diffusers adds fails here until it has one."""
    import inspect

    import diffusers.models.transformers as transformers
    from diffusers.models.modeling_utils import ModelMixin

    from tests.models.diffusers_families import ALL, CLASS_OF, NOT_EXPORTED, SIZED

    classes = {n for n, c in vars(transformers).items() if inspect.isclass(c) and issubclass(c, ModelMixin)}
    assert set(CLASS_OF) == set(ALL) - set(SIZED)  # every family names its class
    swept = set(CLASS_OF.values())
    assert classes <= swept | set(NOT_EXPORTED), sorted(classes - swept - set(NOT_EXPORTED))
    assert not swept & set(NOT_EXPORTED)
