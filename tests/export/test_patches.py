"""Every registered patch computes what the unpatched diffusers model computes (tiny, seeded models of the
family sweep), on the example inputs and on a second attention mask; a patch that changes the output is
refused in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rkpart.export import PATCHES, PatchError, patches_for
from tests.models.diffusers_families import ALL, CLASS_OF, missing_dependencies

pytestmark = [pytest.mark.export,
              pytest.mark.skipif(bool(missing_dependencies()), reason=f"not installed: {missing_dependencies()}")]

#: one family of the sweep per registered class (the first that builds it)
PATCHED = sorted({cls: fam for fam, cls in reversed(CLASS_OF.items()) if cls in PATCHES}.values())


def test_every_registered_class_has_a_family() -> None:
    """A registry entry no family builds would never be checked."""
    assert {CLASS_OF[f] for f in PATCHED} == set(PATCHES)


@pytest.mark.slow
@pytest.mark.parametrize("family", PATCHED)
def test_patches_keep_the_function(family: str) -> None:
    """apply_patches checks each rewrite (rtol / atol of float32) and raises otherwise; here: it applied all
    of them, checked every rewrite on every input set, and a mask input got a second value whose torch
    output differs (the check is not vacuous)."""
    import torch

    from rkpart.export import apply_patches
    from tests.models.diffusers_families import _prepared

    model, inputs, fixed = _prepared(family, 0)
    names = [p.name for p in patches_for(CLASS_OF[family], "torchscript")]
    res = apply_patches(model, inputs, fixed, exporter="torchscript")
    assert [a.name for a in res.applied] == names
    for a in res.applied:
        assert (a.max_abs is None) == (a.kind == "adapter")
        assert a.max_abs is None or a.max_abs <= 1e-4 * float(res.references[0].abs().max()) + 1e-5, a
    masks = [k for k, v in inputs.items() if ("mask" in k.lower() or "drop" in k) and isinstance(v, torch.Tensor)
             and not v.is_floating_point() and v.dim() >= 2 and v.shape[-1] >= 2]
    assert len(res.references) == 1 + (1 if masks else 0)
    if masks:
        assert sorted(res.overrides[0]) == sorted(masks)
        assert not torch.allclose(res.references[0], res.references[1]), "the second mask changes nothing"


@pytest.mark.slow
def test_a_patch_that_changes_the_output_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A fault injected into the registry (a 'rewrite' that scales DiT's output projection) stops the export
    with one line naming the class and the patch (exit code 11); nothing is written."""
    import torch

    from rkpart.export import export_module
    from rkpart.export.patches import Patch
    from tests.models.diffusers_families import _prepared

    def wrong(model: Any, inputs: dict[str, Any], fixed: dict[str, Any]) -> None:
        with torch.no_grad():
            model.proj_out_2.weight.mul_(1.01)

    monkeypatch.setitem(PATCHES, "DiTTransformer2DModel", (Patch("scale", "a fault injected by the test", wrong),))
    model, inputs, fixed = _prepared("dit", 0)
    with pytest.raises(PatchError) as e:
        export_module(model, inputs, tmp_path / "t.onnx", fixed=fixed)
    msg = str(e.value)
    assert e.value.exit_code == 11 and "\n" not in msg
    assert msg.startswith("DiTTransformer2DModel: patch 'scale' changed the output: max |diff| ")
    assert list(tmp_path.iterdir()) == []


def test_sweep_families_without_patches_are_not_touched() -> None:
    """The classes the registry does not name export as they are (no patch but TorchScript's RMSNorm one)."""
    plain = {CLASS_OF[f] for f in ALL if f in CLASS_OF} - set(PATCHES)
    assert "FluxTransformer2DModel" in plain and "PixArtTransformer2DModel" in plain
    for cls in plain:
        assert [p.name for p in patches_for(cls, "dynamo")] == []
        assert [p.name for p in patches_for(cls, "torchscript")] == ["decompose_rms_norm"]
